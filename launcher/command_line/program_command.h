// What each worker execs: PROGRAM itself, or a Python interpreter running it, by torchrun's rules
// (docs/launcher.md, "Python scripts"). Decided once, before any worker starts, so that a missing file or
// interpreter fails with one clear message instead of N identical exec failures.
#pragma once

#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

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

// Finds `program` as execvp would: a name with a '/' is used as given; otherwise each PATH entry is
// tried in order (an empty entry is the current directory; unset PATH means "/bin:/usr/bin", as
// glibc's execvp). Returns the path to exec. Throws ProgramNotRunnable, also when the file found is
// a script whose #! interpreter is missing or cannot run (execve's ENOENT / EACCES, named), or whose
// `#!/usr/bin/env NAME` names a program not on PATH (env's own 127, named before any worker starts).
std::string resolve_program(const std::string& program, const char* path_env);

// The interpreter a script's first bytes name, as the kernel reads a #! line: after "#!" and any
// blanks, up to the next blank or newline (a '\r' is part of the name, as for the kernel).
// nullopt: not a #! script, or nothing named.
std::optional<std::string> shebang_interpreter(const std::string& head);

// What the kernel passes after the interpreter: the rest of the #! line as ONE argument, its leading
// and trailing blanks dropped. nullopt: not a #! script, or nothing after the interpreter.
std::optional<std::string> shebang_argument(const std::string& head);

// The program a `#!/usr/bin/env ARGUMENT` line has env look up on PATH: ARGUMENT whole (blanks
// included, as Linux passes it), or with `env -S` its first word. nullopt: not env, or env with
// other options or NAME=VALUE assignments (not read; env runs as it will).
std::optional<std::string> env_shebang_program(const std::string& head);

// How PROGRAM is to be run: torchrun's --no_python, -m/--module and --run_path, or by its name.
enum class ProgramMode {
  kByName,    // what python runs (PROGRAM.py/.pyw/.pyz/.pyzw/.pyc, a directory with __main__.py): through
              // python, as torchrun; anything else: an executable, as execvp finds it
  kNoPython,  // --no_python: PROGRAM is always executed directly
  kModule,    // -m: PROGRAM names a Python module (python -m)
  kRunPath,   // --run_path: PROGRAM is a file (or zipapp, or directory) of Python code, run with runpy.run_path
};

struct ProgramCommand {
  std::string path;               // what to exec, resolved
  std::vector<std::string> argv;  // argv[0] included; the user's arguments last, untouched
  std::string python_source;      // when Python runs it: where the interpreter came from (and any passed over)
  // --run_path: a worker whose script ended well waits for the node's other workers before exiting,
  // at the file kRunPathFinishedVariable names (as torchrun's --run_path workers wait for its agent).
  bool local_exit_barrier = false;
};

// The file a --run_path worker's exit barrier counts in (one byte a finished worker).
inline constexpr const char* kRunPathFinishedVariable = "CPPRUN_RUN_PATH_FINISHED";

struct ProgramLookup {
  const char* path_env = nullptr;      // $PATH (nullptr: unset)
  const char* python_exec = nullptr;   // $PYTHON_EXEC, torchrun's own choice of interpreter
  const char* virtual_env = nullptr;   // $VIRTUAL_ENV, set by a virtual environment's activate
  const char* conda_prefix = nullptr;  // $CONDA_PREFIX, set by `conda activate`
};

// One interpreter to try, in the order python_candidates() gives.
struct PythonCandidate {
  std::string program;  // a path, or a name looked up on PATH
  std::string source;   // for the user: PYTHON_EXEC, VIRTUAL_ENV, CONDA_PREFIX, "python3 on PATH"
  bool chosen_by_user;  // PYTHON_EXEC: if it cannot run, that is the error; nothing else is tried
  std::string when_unusable;  // said with the interpreter chosen instead; empty for PATH's
};

// PYTHON_EXEC alone if set (torchrun's rule); else the active environment's bin/python
// ($VIRTUAL_ENV, then $CONDA_PREFIX), then python3 and python on PATH.
std::vector<PythonCandidate> python_candidates(const ProgramLookup& lookup);

// The line cpprun prints when Python runs PROGRAM: which interpreter, and why that one.
std::string python_choice_line(const std::string& program, ProgramMode mode, const ProgramCommand& command);

// Throws ProgramNotRunnable with the shell's exit code and what to do.
ProgramCommand resolve_program_command(const std::string& program, const std::vector<std::string>& args,
                                       ProgramMode mode, const ProgramLookup& lookup);

}  // namespace cpprun::launcher
