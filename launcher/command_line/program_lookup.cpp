// PATH search for PROGRAM with execvp's rules and the shell's exit codes.
#include "command_line/program_lookup.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>

namespace cpprun::launcher {
namespace {

enum class Candidate { kMissing, kNotExecutable, kRunnable };

Candidate check(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return Candidate::kMissing;
  if (!S_ISREG(st.st_mode) || access(path.c_str(), X_OK) != 0) return Candidate::kNotExecutable;
  return Candidate::kRunnable;
}

}  // namespace

std::string resolve_program(const std::string& program, const char* path_env) {
  if (program.empty()) throw ProgramNotRunnable("cpprun: PROGRAM is an empty string", 127);
  if (program.find('/') != std::string::npos) {
    switch (check(program)) {
      case Candidate::kRunnable:
        return program;
      case Candidate::kMissing:
        throw ProgramNotRunnable("cpprun: cannot run PROGRAM '" + program +
                                     "': no such file (check the path, relative to " +
                                     "the current directory)", 127);
      case Candidate::kNotExecutable:
        throw ProgramNotRunnable("cpprun: cannot run PROGRAM '" + program +
                                     "': not an executable file (chmod +x it, or name its "
                                     "interpreter first, e.g. `cpprun python3 " + program + "`)", 126);
    }
  }
  const std::string path = path_env != nullptr ? path_env : "/bin:/usr/bin";
  std::string not_executable;  // first match that exists but cannot run, for the error
  std::string::size_type start = 0;
  while (start <= path.size()) {
    const auto colon = std::min(path.find(':', start), path.size());
    const std::string dir = path.substr(start, colon - start);
    const std::string candidate = (dir.empty() ? std::string(".") : dir) + "/" + program;
    switch (check(candidate)) {
      case Candidate::kRunnable:
        return candidate;
      case Candidate::kNotExecutable:
        if (not_executable.empty()) not_executable = candidate;
        break;
      case Candidate::kMissing:
        break;
    }
    start = colon + 1;
  }
  if (!not_executable.empty()) {
    throw ProgramNotRunnable("cpprun: cannot run PROGRAM '" + program + "': found " + not_executable +
                                 " on PATH but it is not an executable file", 126);
  }
  throw ProgramNotRunnable("cpprun: cannot run PROGRAM '" + program + "': not found on PATH (PATH=" +
                               path + "); give its path (e.g. ./" + program +
                               ") or add its directory to PATH", 127);
}

}  // namespace cpprun::launcher
