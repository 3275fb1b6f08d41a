// Finding PROGRAM the way execvp would, once, before any worker starts: a typo then fails with one
// clear message instead of N identical exec failures.
#pragma once

#include <stdexcept>
#include <string>

namespace cpprun::launcher {

class ProgramNotRunnable : public std::runtime_error {
 public:
  ProgramNotRunnable(const std::string& message, int exit_code)
      : std::runtime_error(message), exit_code_(exit_code) {}
  // The shell's codes: 127 not found, 126 found but not executable.
  int exit_code() const { return exit_code_; }

 private:
  int exit_code_;
};

// A name with a '/' is used as given; otherwise each PATH entry is tried in order (an empty entry
// is the current directory; unset PATH means "/bin:/usr/bin", as glibc's execvp). Returns the path
// to exec. Throws ProgramNotRunnable.
std::string resolve_program(const std::string& program, const char* path_env);

}  // namespace cpprun::launcher
