// torchrun's rules for what a worker runs: `python -u SCRIPT`, `python -u -m MODULE`, a file run
// with runpy.run_path, or PROGRAM itself, found with execvp's rules (and its #! interpreter checked).
// The interpreter: $PYTHON_EXEC (torchrun's variable), else the active environment's, else python3,
// else python, found on PATH.
#include "command_line/program_command.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <utility>

namespace cpprun::launcher {
namespace {

enum class Candidate { kMissing, kNotExecutable, kRunnable };

Candidate check(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return Candidate::kMissing;
  if (!S_ISREG(st.st_mode) || access(path.c_str(), X_OK) != 0) return Candidate::kNotExecutable;
  return Candidate::kRunnable;
}

// A command whose argv is still to be written: the interpreter's path, and where it came from.
ProgramCommand find_python(const std::string& program, const ProgramLookup& lookup) {
  std::string passed_over;  // environments whose interpreter could not run: said with the choice
  for (const PythonCandidate& candidate : python_candidates(lookup)) {
    try {
      return {resolve_program(candidate.program, lookup.path_env), {}, candidate.source + passed_over};
    } catch (const ProgramNotRunnable& e) {
      if (candidate.chosen_by_user) {
        throw ProgramNotRunnable(std::string(e.what()) + " (the Python interpreter named by PYTHON_EXEC=" +
                                     candidate.program + ")", e.exit_code());
      }
      if (!candidate.when_unusable.empty()) passed_over += "; " + candidate.when_unusable;
    }
  }
  throw ProgramNotRunnable("cpprun: '" + program +
                               "' is Python code, but neither python3 nor python is on PATH (PATH=" +
                               (lookup.path_env != nullptr ? lookup.path_env : "") + passed_over +
                               "). Activate your virtual environment, set PYTHON_EXEC=/path/to/python, or run an "
                               "executable with --no_python",
                           127);
}

// As much of a file as the kernel reads for its #! line (BINPRM_BUF_SIZE); empty if unreadable.
std::string file_head(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char buffer[256];
  in.read(buffer, sizeof(buffer));
  return std::string(buffer, static_cast<std::size_t>(in.gcount()));
}

// Where execvp would find PROGRAM (a name without '/') on PATH: the first runnable match, else the
// first that exists but cannot run (execvp's EACCES, the shell's 126); both empty: not there (127).
struct PathMatch {
  std::string runnable;
  std::string not_executable;
};

PathMatch find_on_path(const std::string& program, const std::string& path) {
  PathMatch match;
  std::string::size_type start = 0;
  while (start <= path.size()) {
    const auto colon = std::min(path.find(':', start), path.size());
    const std::string dir = path.substr(start, colon - start);
    const std::string candidate = (dir.empty() ? std::string(".") : dir) + "/" + program;
    const Candidate found = check(candidate);
    if (found == Candidate::kRunnable) {
      match.runnable = candidate;
      return match;
    }
    if (found == Candidate::kNotExecutable && match.not_executable.empty()) match.not_executable = candidate;
    start = colon + 1;
  }
  return match;
}

// execvp's default when PATH is unset, as glibc's (and so env's).
std::string path_or_default(const char* path_env) { return path_env != nullptr ? path_env : "/bin:/usr/bin"; }

std::string shown(const std::string& text) {  // a '\r' made visible
  std::string out;
  for (const char c : text) out += c == '\r' ? std::string("\\r") : std::string(1, c);
  return out;
}

// `#!/usr/bin/env NAME`: the kernel finds env, and each worker's env then fails to find NAME (exit
// 127, "No such file or directory" in every worker's stderr). Looked up here as env's execvp will.
void check_env_program(const std::string& program, const std::string& script, const std::string& head,
                       const char* path_env) {
  const std::optional<std::string> name = env_shebang_program(head);
  if (!name) return;
  const std::string line = "#!" + *shebang_interpreter(head) + " " + shown(*shebang_argument(head));
  const std::string what = "cpprun: cannot run PROGRAM '" + program + "'" +
                           (script == program ? "" : " (found at " + script + ")") + ": its #! line (" + line +
                           ") has env run '" + shown(*name) + "', ";
  if (name->find('/') != std::string::npos) {
    const Candidate found = check(*name);
    if (found == Candidate::kRunnable) return;
    throw ProgramNotRunnable(what + (found == Candidate::kMissing ? "which does not exist; install it, or change "
                                                                    "the #! line"
                                                                  : "which is not an executable file"),
                             found == Candidate::kMissing ? 127 : 126);
  }
  const std::string path = path_or_default(path_env);
  const PathMatch match = find_on_path(*name, path);
  if (!match.runnable.empty()) return;
  if (!match.not_executable.empty()) {
    throw ProgramNotRunnable(what + "but " + match.not_executable + " on PATH is not an executable file", 126);
  }
  std::string fix = "install it, activate the environment that has it, or change the #! line";
  if (name->back() == '\r') {
    fix = "the #! line ends in a carriage return (Windows line endings); convert the file, e.g. `sed -i 's/\\r$//' " +
          script + "`";
  } else if (name->find_first_of(" \t") != std::string::npos) {
    // Linux passes the rest of a #! line to env as one argument: the name includes the blanks.
    fix = "Linux passes everything after the interpreter as one argument, so env looks for a program named '" +
          shown(*name) + "'; split it with env's -S: #!" + *shebang_interpreter(head) + " -S " + shown(*name);
  }
  throw ProgramNotRunnable(what + "which is not on PATH (PATH=" + path + "); " + fix, 127);
}

// A script whose #! interpreter is missing fails execve() with ENOENT, the error of a missing
// PROGRAM: each worker would report "No such file or directory" about a file that is there. Said
// once, with both names, before any worker starts.
void check_interpreter(const std::string& program, const std::string& path, const char* path_env) {
  const std::string head = file_head(path);
  const std::optional<std::string> interpreter = shebang_interpreter(head);
  if (!interpreter) return;
  const Candidate found = check(*interpreter);
  if (found == Candidate::kRunnable) {
    check_env_program(program, path, head, path_env);
    return;
  }
  std::string why = found == Candidate::kMissing ? "does not exist" : "is not an executable file";
  if (interpreter->back() == '\r') {
    why += ": the #! line ends in a carriage return (Windows line endings); convert the file, e.g. "
           "`sed -i 's/\\r$//' " + path + "`";
  } else if (found == Candidate::kMissing) {
    why += "; install it, or change the #! line (e.g. #!/usr/bin/env bash)";
  }
  throw ProgramNotRunnable("cpprun: cannot run PROGRAM '" + program + "'" +
                               (path == program ? "" : " (found at " + path + ")") + ": its interpreter '" +
                               shown(*interpreter) + "' (from its #! line) " + why,
                           found == Candidate::kMissing ? 127 : 126);
}

bool ends_with(const std::string& text, const char* tail) {
  const std::size_t n = std::strlen(tail);
  return text.size() >= n && text.compare(text.size() - n, n, tail) == 0;
}

bool is_directory(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool holds_python_main(const std::string& dir) {
  for (const char* main : {"/__main__.py", "/__main__.pyc"}) {
    if (access((dir + main).c_str(), R_OK) == 0) return true;
  }
  return false;
}

// What `python PROGRAM` runs, as torchrun runs every program: a script (.py, .pyw), a zipapp
// (.pyz, .pyzw), bytecode (.pyc), or a directory holding __main__.py. Anything else cpprun execs
// itself (Note in program_command.h); a bare name is looked up on PATH even where a directory of
// that name is here (`cpprun python3 ...` beside a python3/ folder).
bool runs_in_python(const std::string& program) {
  for (const char* tail : {".py", ".pyw", ".pyz", ".pyzw", ".pyc"}) {
    if (ends_with(program, tail)) return true;
  }
  return program.find('/') != std::string::npos && is_directory(program) && holds_python_main(program);
}

// The file or directory python will run exists and is one it can run, or a named error.
void require_python_program(const std::string& program, const char* what) {
  const std::string named = "cpprun: cannot run " + std::string(what) + " '" + program + "'";
  struct stat st {};
  if (stat(program.c_str(), &st) != 0) {
    throw ProgramNotRunnable(named + ": no such file (relative to the current directory, as python would look)", 127);
  }
  if (S_ISDIR(st.st_mode)) {
    if (holds_python_main(program)) return;
    throw ProgramNotRunnable(named + ": a directory without __main__.py, which python cannot run (name the script "
                                     "inside it, or add __main__.py)", 126);
  }
  if (!S_ISREG(st.st_mode)) throw ProgramNotRunnable(named + ": not a regular file", 126);
}

// torchrun's --run_path: runpy.run_path as __main__, with sys.argv as the script would see it.
// Then, as torchrun (whose --run_path worker, a multiprocessing child, returns its result and waits
// for the agent's event that every local worker has returned), a worker whose script ended well
// waits for the node's others before its interpreter exits: a script that never calls
// destroy_process_group() would otherwise tear down Gloo while a peer still runs, and abort
// ("terminate called without an active exception"). The barrier is a file of one byte a finished
// worker (kRunPathFinishedVariable); the first to see all LOCAL_WORLD_SIZE bytes removes it, and a
// missing file means the barrier is passed. A failed script does not wait: cpprun stops the others.
// A barrier that cannot be written (a full disk) is skipped rather than failing a script that ended well.
// Note [--run_path under @record]
// torchrun runs the script inside its worker through torch's record() (elastic/multiprocessing/api.py
// wraps run_script_path): faulthandler on for every thread, and an exception written to
// TORCHELASTIC_ERROR_FILE as ErrorHandler.record_exception writes it ({"message": {"message": "TYPE: TEXT",
// "extraInfo": {"py_callstack": TRACEBACK, "timestamp": "SECONDS"}}}), which the launcher hands over
// to its own error file; a SystemExit is not recorded. The same here, without importing torch.
std::string run_path_code() {
  return std::string(
    "import faulthandler, json, os, runpy, sys, time, traceback\n"
    "sys.argv = sys.argv[1:]\n"
    // python -c puts the current directory first on sys.path; torchrun's runpy.run_path does not.
    "if sys.path and sys.path[0] == '':\n"
    "    del sys.path[0]\n"
    "def _cpprun_local_exit_barrier():\n"
    "    path = os.environ.get('") + kRunPathFinishedVariable + "')\n"
    "    count = int(os.environ.get('LOCAL_WORLD_SIZE', '1'))\n"
    "    if not path or count <= 1:\n"
    "        return\n"
    "    try:\n"
    "        with open(path, 'ab', buffering=0) as f:\n"
    "            f.write(b'.')\n"
    "    except OSError:\n"
    "        return\n"
    "    while True:\n"
    "        try:\n"
    "            if os.path.getsize(path) >= count:\n"
    "                os.unlink(path)\n"
    "                return\n"
    "        except OSError:\n"
    "            return\n"
    "        time.sleep(0.005)\n"
    "def _cpprun_record_exception(e):\n"
    "    file = os.environ.get('TORCHELASTIC_ERROR_FILE')\n"
    "    if file:\n"
    "        data = {'message': {'message': f'{type(e).__name__}: {e}', 'extraInfo': {\n"
    "            'py_callstack': traceback.format_exc(), 'timestamp': str(int(time.time()))}}}\n"
    "        with open(file, 'w') as fp:\n"
    "            json.dump(data, fp)\n"
    "try:\n"
    "    faulthandler.enable(all_threads=True)\n"
    "except Exception:\n"
    "    pass\n"
    "try:\n"
    "    runpy.run_path(sys.argv[0], run_name='__main__')\n"
    "except SystemExit as e:\n"
    "    if e.code not in (None, 0):\n"
    "        raise\n"
    "    _cpprun_local_exit_barrier()\n"
    "    raise\n"
    "except Exception as e:\n"
    "    _cpprun_record_exception(e)\n"
    "    raise\n"
    "_cpprun_local_exit_barrier()\n";
}

}  // namespace

std::string resolve_program(const std::string& program, const char* path_env) {
  if (program.empty()) throw ProgramNotRunnable("cpprun: PROGRAM is an empty string", 127);
  if (program.find('/') != std::string::npos) {
    const Candidate found = check(program);
    if (found == Candidate::kRunnable) {
      check_interpreter(program, program, path_env);
      return program;
    }
    if (found == Candidate::kMissing) {
      throw ProgramNotRunnable("cpprun: cannot run PROGRAM '" + program +
                                   "': no such file (check the path, relative to the current directory)", 127);
    }
    if (is_directory(program)) {
      throw ProgramNotRunnable("cpprun: cannot run PROGRAM '" + program + "': a directory (python runs one that "
                                   "holds __main__.py; this one does not)", 126);
    }
    throw ProgramNotRunnable("cpprun: cannot run PROGRAM '" + program +
                                 "': not an executable file (chmod +x it, or name its interpreter first, e.g. "
                                 "`cpprun python3 " + program + "`)", 126);
  }
  const std::string path = path_or_default(path_env);
  const PathMatch match = find_on_path(program, path);
  if (!match.runnable.empty()) {
    check_interpreter(program, match.runnable, path_env);
    return match.runnable;
  }
  if (!match.not_executable.empty()) {
    throw ProgramNotRunnable("cpprun: cannot run PROGRAM '" + program + "': found " + match.not_executable +
                                 " on PATH but it is not an executable file", 126);
  }
  throw ProgramNotRunnable("cpprun: cannot run PROGRAM '" + program + "': not found on PATH (PATH=" +
                               path + "); give its path (e.g. ./" + program +
                               ") or add its directory to PATH", 127);
}

std::optional<std::string> shebang_interpreter(const std::string& head) {
  if (head.size() < 2 || head[0] != '#' || head[1] != '!') return std::nullopt;
  const auto blank = [](char c) { return c == ' ' || c == '\t'; };
  std::size_t start = 2;
  while (start < head.size() && blank(head[start])) ++start;
  std::size_t end = start;
  while (end < head.size() && !blank(head[end]) && head[end] != '\n' && head[end] != '\0') ++end;
  if (end == start) return std::nullopt;
  return head.substr(start, end - start);
}

std::optional<std::string> shebang_argument(const std::string& head) {
  if (!shebang_interpreter(head)) return std::nullopt;
  const auto blank = [](char c) { return c == ' ' || c == '\t'; };
  std::size_t start = 2;
  while (start < head.size() && blank(head[start])) ++start;
  while (start < head.size() && !blank(head[start]) && head[start] != '\n' && head[start] != '\0') ++start;
  while (start < head.size() && blank(head[start])) ++start;
  std::size_t end = std::min(head.find('\n', start), head.size());
  while (end > start && blank(head[end - 1])) --end;
  if (end == start) return std::nullopt;
  return head.substr(start, end - start);
}

std::optional<std::string> env_shebang_program(const std::string& head) {
  const std::optional<std::string> interpreter = shebang_interpreter(head);
  const std::optional<std::string> argument = shebang_argument(head);
  if (!interpreter || !argument) return std::nullopt;
  const std::string::size_type slash = interpreter->rfind('/');
  if (interpreter->substr(slash == std::string::npos ? 0 : slash + 1) != "env") return std::nullopt;
  std::string name = *argument;
  if (name.rfind("-S", 0) == 0) {  // env -S splits its argument into words: the first is the program
    const auto first = name.find_first_not_of(" \t", 2);
    if (first == std::string::npos) return std::nullopt;
    name = name.substr(first, name.find_first_of(" \t", first) - first);
  }
  // Other options (-i, -u NAME, ...) and assignments (NAME=VALUE): not read here; env runs as it will.
  if (name.empty() || name[0] == '-' || name.find('=') != std::string::npos) return std::nullopt;
  return name;
}

std::vector<PythonCandidate> python_candidates(const ProgramLookup& lookup) {
  const auto set = [](const char* value) { return value != nullptr && *value != '\0'; };
  if (set(lookup.python_exec)) return {{lookup.python_exec, "PYTHON_EXEC", true, ""}};
  std::vector<PythonCandidate> candidates;
  for (const auto& [name, value] :
       {std::pair{"VIRTUAL_ENV", lookup.virtual_env}, {"CONDA_PREFIX", lookup.conda_prefix}}) {
    if (!set(value)) continue;
    const std::string dir = value;
    candidates.push_back(
        {dir + "/bin/python", name, false, std::string(name) + "=" + dir + " has no runnable bin/python"});
  }
  candidates.push_back({"python3", "python3 on PATH", false, ""});
  candidates.push_back({"python", "python on PATH", false, ""});
  return candidates;
}

std::string python_choice_line(const std::string& program, ProgramMode mode, const ProgramCommand& command) {
  const std::string what = mode == ProgramMode::kModule ? "-m " + program
                           : mode == ProgramMode::kRunPath ? "--run_path " + program
                                                           : program;
  return "cpprun: running " + what + " with " + command.path + " (" + command.python_source + ")";
}

ProgramCommand resolve_program_command(const std::string& program, const std::vector<std::string>& args,
                                       ProgramMode mode, const ProgramLookup& lookup) {
  ProgramCommand command;
  if (mode == ProgramMode::kNoPython || (mode == ProgramMode::kByName && !runs_in_python(program))) {
    command = {resolve_program(program, lookup.path_env), {program}, ""};
  } else {
    if (program.empty()) throw ProgramNotRunnable("cpprun: PROGRAM is an empty string", 127);
    if (mode == ProgramMode::kByName) require_python_program(program, "the Python script");
    if (mode == ProgramMode::kRunPath) require_python_program(program, "--run_path");
    command = find_python(program, lookup);
    // -u: unbuffered, as torchrun runs its workers, so lines reach the console as they are printed.
    command.argv = {command.path, "-u"};
    if (mode == ProgramMode::kModule) command.argv.push_back("-m");
    if (mode == ProgramMode::kRunPath) command.argv.insert(command.argv.end(), {"-c", run_path_code()});
    command.local_exit_barrier = mode == ProgramMode::kRunPath;
    command.argv.push_back(program);
  }
  command.argv.insert(command.argv.end(), args.begin(), args.end());
  return command;
}

}  // namespace cpprun::launcher
