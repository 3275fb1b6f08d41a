// Unit tests of what a worker runs: torchrun's rules for Python scripts and modules, the
// interpreter's choice, executables as before, and PATH lookup (execvp's rules, the shell's 126/127).
#include "catch.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "command_line/program_command.h"

using namespace cpprun::launcher;
using Catch::Matchers::Contains;
using Args = std::vector<std::string>;

namespace {

// A scratch dir with bin/python3, bin/python (both executable), train.py and notes.txt (neither).
struct Scratch {
  std::string dir;
  Scratch() {
    char name[] = "/tmp/cpprun-program-command-XXXXXX";
    dir = mkdtemp(name);
    mkdir((dir + "/bin").c_str(), 0755);
    mkdir((dir + "/other").c_str(), 0755);
    for (const char* exe : {"/bin/python3", "/bin/python", "/other/python"}) write(exe, "#!/bin/sh\n", 0755);
    write("/train.py", "print('hi')\n", 0644);
    write("/notes.txt", "", 0644);
  }
  ~Scratch() { std::system(("rm -rf '" + dir + "'").c_str()); }
  void write(const std::string& rel, const std::string& text, mode_t mode) const {
    std::ofstream(dir + rel) << text;
    chmod((dir + rel).c_str(), mode);
  }
  std::string bin() const { return dir + "/bin"; }
};

int failure_code(const std::string& program, ProgramMode mode, const ProgramLookup& lookup, std::string* message) {
  try {
    resolve_program_command(program, {}, mode, lookup);
  } catch (const ProgramNotRunnable& e) {
    if (message != nullptr) *message = e.what();
    return e.exit_code();
  }
  return 0;
}

int lookup_failure_code(const std::string& program, const char* path) {
  try {
    resolve_program(program, path);
  } catch (const ProgramNotRunnable& e) {
    return e.exit_code();
  }
  return 0;
}

}  // namespace

TEST_CASE("program_command: a .py script runs as `python3 -u SCRIPT`, like torchrun", "[program_command]") {
  Scratch s;
  const std::string path = s.bin() + ":/bin:/usr/bin";
  const ProgramCommand c = resolve_program_command(s.dir + "/train.py", {"--lr", "1"}, ProgramMode::kByName, {path.c_str()});
  CHECK(c.path == s.bin() + "/python3");
  CHECK(c.argv == Args{s.bin() + "/python3", "-u", s.dir + "/train.py", "--lr", "1"});
  CHECK(c.python_source == "python3 on PATH");
}

TEST_CASE("program_command: -m runs a module, --run_path a file through runpy", "[program_command]") {
  Scratch s;
  const std::string path = s.bin();
  const ProgramCommand m = resolve_program_command("pkg.train", {"x"}, ProgramMode::kModule, {path.c_str()});
  CHECK(m.argv == Args{s.bin() + "/python3", "-u", "-m", "pkg.train", "x"});
  const ProgramCommand r = resolve_program_command(s.dir + "/notes.txt", {"x"}, ProgramMode::kRunPath, {path.c_str()});
  REQUIRE(r.argv.size() == 6);
  CHECK(r.argv[2] == "-c");
  CHECK_THAT(r.argv[3], Contains("runpy.run_path(sys.argv[0], run_name='__main__')"));
  CHECK(Args(r.argv.begin() + 4, r.argv.end()) == Args{s.dir + "/notes.txt", "x"});
  // --run_path alone waits for the node's other workers at exit, as torchrun's (at the file the
  // launcher names; launcher.python_scripts runs it).
  CHECK(r.local_exit_barrier);
  CHECK_THAT(r.argv[3], Contains("os.environ.get('CPPRUN_RUN_PATH_FINISHED')"));
  CHECK_FALSE(m.local_exit_barrier);
}

// torchrun runs every program with python: cpprun does for what python runs as a program (scripts,
// zipapps, bytecode, a directory with __main__.py) and execs the rest; a directory without
// __main__.py, or named *.py, is named as such (it was "not found on PATH" or "no such file").
TEST_CASE("program_command: zipapps, bytecode and directories with __main__.py run in python", "[program_command]") {
  Scratch s;
  const std::string path = s.bin();
  s.write("/app.pyz", "PK", 0644);
  s.write("/compiled.pyc", "", 0644);
  mkdir((s.dir + "/app").c_str(), 0755);
  s.write("/app/__main__.py", "print('hi')\n", 0644);
  mkdir((s.dir + "/dir.py").c_str(), 0755);
  s.write("/dir.py/__main__.py", "print('hi')\n", 0644);
  mkdir((s.dir + "/empty").c_str(), 0755);
  for (const std::string program : {s.dir + "/app.pyz", s.dir + "/compiled.pyc", s.dir + "/app", s.dir + "/app/",
                                    s.dir + "/dir.py"}) {
    INFO(program);
    const ProgramCommand c = resolve_program_command(program, {"x"}, ProgramMode::kByName, {path.c_str()});
    CHECK(c.argv == Args{s.bin() + "/python3", "-u", program, "x"});
    const ProgramCommand r = resolve_program_command(program, {}, ProgramMode::kRunPath, {path.c_str()});
    CHECK(r.argv.back() == program);
  }
  std::string message;
  CHECK(failure_code(s.dir + "/empty", ProgramMode::kByName, {path.c_str()}, &message) == 126);
  CHECK_THAT(message, Contains("cannot run PROGRAM '" + s.dir + "/empty': a directory"));
  CHECK(failure_code(s.dir + "/empty", ProgramMode::kRunPath, {path.c_str()}, &message) == 126);
  CHECK_THAT(message, Contains("cannot run --run_path '" + s.dir + "/empty': a directory without __main__.py"));
  // Not what python runs: exec'd as before.
  CHECK(resolve_program_command(s.dir + "/bin/python", {}, ProgramMode::kByName, {path.c_str()}).argv ==
        Args{s.dir + "/bin/python"});
  // A bare name is looked up on PATH, even beside a directory of that name (a repository's
  // python/ or sh/ folder): `cpprun sh -c ...` runs /bin/sh.
  char here[4096];
  REQUIRE(getcwd(here, sizeof here) != nullptr);
  REQUIRE(chdir(s.dir.c_str()) == 0);
  mkdir("sh", 0755);
  s.write("/sh/__main__.py", "", 0644);
  const ProgramCommand sh = resolve_program_command("sh", {"-c", "true"}, ProgramMode::kByName, {"/bin:/usr/bin"});
  REQUIRE(chdir(here) == 0);
  CHECK(sh.path == "/bin/sh");
}

TEST_CASE("program_command: PYTHON_EXEC, then python3, then python", "[program_command]") {
  Scratch s;
  const std::string path = s.bin();
  const std::string other = s.dir + "/other/python";
  CHECK(resolve_program_command("m", {}, ProgramMode::kModule, {path.c_str(), other.c_str()}).path == other);
  CHECK(resolve_program_command("m", {}, ProgramMode::kModule, {path.c_str(), other.c_str()}).python_source ==
        "PYTHON_EXEC");
  CHECK(resolve_program_command("m", {}, ProgramMode::kModule, {path.c_str(), ""}).path == s.bin() + "/python3");
  unlink((s.bin() + "/python3").c_str());
  CHECK(resolve_program_command("m", {}, ProgramMode::kModule, {path.c_str()}).path == s.bin() + "/python");
}

TEST_CASE("program_command: executables run directly, as before", "[program_command]") {
  Scratch s;
  const ProgramCommand c = resolve_program_command("sh", {"-c", "true"}, ProgramMode::kByName, {"/bin:/usr/bin"});
  CHECK(c.path == "/bin/sh");
  CHECK(c.argv == Args{"sh", "-c", "true"});
  CHECK(c.python_source.empty());
  // --no_python: even a .py file is exec'd itself (here not executable: the shell's 126).
  std::string message;
  CHECK(failure_code(s.dir + "/train.py", ProgramMode::kNoPython, {s.bin().c_str()}, &message) == 126);
  CHECK_THAT(message, Contains("not an executable file"));
}

TEST_CASE("program_command: a missing script or interpreter is one clear error", "[program_command]") {
  Scratch s;
  std::string message;
  CHECK(failure_code("missing.py", ProgramMode::kByName, {s.bin().c_str()}, &message) == 127);
  CHECK_THAT(message, Contains("cannot run the Python script 'missing.py': no such file"));
  CHECK(failure_code("missing.py", ProgramMode::kRunPath, {s.bin().c_str()}, &message) == 127);
  CHECK_THAT(message, Contains("cannot run --run_path 'missing.py'"));
  CHECK(failure_code(s.dir + "/train.py", ProgramMode::kByName, {"/nonexistent"}, &message) == 127);
  CHECK_THAT(message, Contains("neither python3 nor python is on PATH (PATH=/nonexistent)") &&
                          Contains("set PYTHON_EXEC=/path/to/python"));
  CHECK(failure_code("pkg", ProgramMode::kModule, {s.bin().c_str(), "/nonexistent/python"}, &message) == 127);
  CHECK_THAT(message, Contains("(the Python interpreter named by PYTHON_EXEC=/nonexistent/python)"));
}

TEST_CASE("program_command: PATH is searched in order, paths are used as given", "[program_command]") {
  CHECK(resolve_program("sh", "/nonexistent:/bin:/usr/bin") == "/bin/sh");
  CHECK(resolve_program("/bin/sh", "/nonexistent") == "/bin/sh");
  CHECK(resolve_program("sh", nullptr) == "/bin/sh");  // unset PATH: execvp's default
}

TEST_CASE("program_command: a missing program is 127, a non-executable one 126, with the name", "[program_command]") {
  CHECK(lookup_failure_code("no-such-program-cpprun", "/bin:/usr/bin") == 127);
  CHECK(lookup_failure_code("./no-such-program-cpprun", "/bin") == 127);
  char plain_file[] = "/tmp/cpprun-test-lookup.XXXXXX";
  const int fd = mkstemp(plain_file);  // mode 0600: exists, not executable
  REQUIRE(fd >= 0);
  close(fd);
  const int code = lookup_failure_code(plain_file, "/bin");
  unlink(plain_file);
  CHECK(code == 126);
  CHECK(lookup_failure_code("/bin", "/bin") == 126);  // a directory
  REQUIRE_THROWS_WITH(resolve_program("no-such-program-cpprun", "/bin"),
                      Contains("'no-such-program-cpprun'") && Contains("PATH=/bin"));
}

TEST_CASE("program_command: the #! interpreter, read as the kernel reads it", "[program_command]") {
  CHECK(shebang_interpreter("#!/bin/sh\necho hi\n") == "/bin/sh");
  CHECK(shebang_interpreter("#! \t/usr/bin/env python3 -u\n") == "/usr/bin/env");
  CHECK(shebang_interpreter("#!/bin/bash\r\n") == "/bin/bash\r");  // Windows line endings: part of the name
  CHECK(shebang_interpreter("#!/no/such/interp") == "/no/such/interp");  // no newline in the bytes read
  CHECK_FALSE(shebang_interpreter("#!\n").has_value());
  CHECK_FALSE(shebang_interpreter("#! \n").has_value());
  CHECK_FALSE(shebang_interpreter("\x7f" "ELF").has_value());
  CHECK_FALSE(shebang_interpreter("# !/bin/sh\n").has_value());
  CHECK_FALSE(shebang_interpreter("").has_value());
}

TEST_CASE("program_command: a script whose #! interpreter is missing is named with it, 127", "[program_command]") {
  Scratch s;
  s.write("/train.sh", "#!/no/such/interp\necho hi\n", 0755);
  std::string message;
  CHECK(failure_code(s.dir + "/train.sh", ProgramMode::kByName, {"/bin:/usr/bin"}, &message) == 127);
  CHECK_THAT(message, Contains("cannot run PROGRAM '" + s.dir + "/train.sh': its interpreter '/no/such/interp' "
                               "(from its #! line) does not exist"));
  // Found on PATH: where it was found too; --no_python checks the same.
  CHECK(failure_code("train.sh", ProgramMode::kNoPython, {s.dir.c_str()}, &message) == 127);
  CHECK_THAT(message, Contains("'train.sh' (found at " + s.dir + "/train.sh): its interpreter '/no/such/interp'"));
  // A carriage return says why.
  s.write("/dos.sh", "#!/bin/sh\r\necho hi\r\n", 0755);
  CHECK(failure_code(s.dir + "/dos.sh", ProgramMode::kByName, {"/bin"}, &message) == 127);
  CHECK_THAT(message, Contains("its interpreter '/bin/sh\\r'") && Contains("Windows line endings"));
  // An interpreter that is there but cannot run: the shell's 126.
  s.write("/by-notes.sh", "#!" + s.dir + "/notes.txt\n", 0755);
  CHECK(failure_code(s.dir + "/by-notes.sh", ProgramMode::kByName, {"/bin"}, &message) == 126);
  CHECK_THAT(message, Contains("its interpreter '" + s.dir + "/notes.txt' (from its #! line) is not an executable file"));
  // A good #! line, and a PYTHON_EXEC that is a script with a missing interpreter.
  CHECK(resolve_program_command(s.dir + "/bin/python3", {}, ProgramMode::kByName, {"/bin"}).path ==
        s.dir + "/bin/python3");
  const std::string shim = s.dir + "/train.sh";
  CHECK(failure_code("m", ProgramMode::kModule, {s.bin().c_str(), shim.c_str()}, &message) == 127);
  CHECK_THAT(message, Contains("'/no/such/interp'") && Contains("named by PYTHON_EXEC=" + shim));
}

TEST_CASE("program_command: what a #! line passes its interpreter, and what env runs", "[program_command]") {
  CHECK(shebang_argument("#!/usr/bin/env python3\n") == "python3");
  CHECK(shebang_argument("#! /usr/bin/env \t python3 -u  \t\nrest\n") == "python3 -u");  // one argument, trimmed
  CHECK(shebang_argument("#!/usr/bin/env python3\r\n") == "python3\r");  // Windows line endings: kept, as the kernel
  CHECK(shebang_argument("#!/usr/bin/env python3") == "python3");        // no newline in the bytes read
  CHECK_FALSE(shebang_argument("#!/bin/sh\n").has_value());
  CHECK_FALSE(shebang_argument("#!/bin/sh  \n").has_value());
  CHECK_FALSE(shebang_argument("echo hi\n").has_value());

  CHECK(env_shebang_program("#!/usr/bin/env python3\n") == "python3");
  CHECK(env_shebang_program("#!/bin/env bash\n") == "bash");
  CHECK(env_shebang_program("#!/usr/bin/env python3 -u\n") == "python3 -u");  // Linux: one name, blanks and all
  CHECK(env_shebang_program("#!/usr/bin/env -S python3 -u\n") == "python3");
  CHECK(env_shebang_program("#!/usr/bin/env -Spython3 -u\n") == "python3");
  CHECK(env_shebang_program("#!/usr/bin/env /opt/py/bin/python\n") == "/opt/py/bin/python");
  CHECK_FALSE(env_shebang_program("#!/usr/bin/env\n").has_value());            // env alone prints the environment
  CHECK_FALSE(env_shebang_program("#!/usr/bin/env -i python3\n").has_value());  // other options: not read
  CHECK_FALSE(env_shebang_program("#!/usr/bin/env -S\n").has_value());
  CHECK_FALSE(env_shebang_program("#!/usr/bin/env -S A=1 python3\n").has_value());
  CHECK_FALSE(env_shebang_program("#!/bin/sh -e\n").has_value());              // not env
  CHECK_FALSE(env_shebang_program("#!/usr/bin/envy python3\n").has_value());
}

TEST_CASE("program_command: a #!/usr/bin/env NAME script whose NAME is not on PATH is named, 127",
          "[program_command]") {
  Scratch s;
  const std::string path = s.bin() + ":/bin:/usr/bin";
  std::string message;
  s.write("/train.sh", "#!/usr/bin/env cpprun-no-such-interpreter\necho hi\n", 0755);
  CHECK(failure_code(s.dir + "/train.sh", ProgramMode::kByName, {path.c_str()}, &message) == 127);
  CHECK_THAT(message, Contains("cannot run PROGRAM '" + s.dir + "/train.sh': its #! line "
                               "(#!/usr/bin/env cpprun-no-such-interpreter) has env run 'cpprun-no-such-interpreter', "
                               "which is not on PATH (PATH=" + path + "); install it"));
  // Found on PATH by its name: where it was found too; --no_python checks the same.
  CHECK(failure_code("train.sh", ProgramMode::kNoPython, {s.dir.c_str()}, &message) == 127);
  CHECK_THAT(message, Contains("'train.sh' (found at " + s.dir + "/train.sh): its #! line"));
  // The name is looked up on the PATH the workers get, as env's execvp: there, it runs.
  s.write("/py.sh", "#!/usr/bin/env python3\n", 0755);
  CHECK(resolve_program(s.dir + "/py.sh", path.c_str()) == s.dir + "/py.sh");
  CHECK(failure_code(s.dir + "/py.sh", ProgramMode::kByName, {"/nonexistent"}, &message) == 127);
  CHECK_THAT(message, Contains("has env run 'python3', which is not on PATH (PATH=/nonexistent)"));
  // There but not executable: env's 126.
  s.write("/notes.sh", "#!/usr/bin/env notes.txt\n", 0755);
  CHECK(failure_code(s.dir + "/notes.sh", ProgramMode::kByName, {s.dir.c_str()}, &message) == 126);
  CHECK_THAT(message, Contains("but " + s.dir + "/notes.txt on PATH is not an executable file"));
  // Options without -S are part of the name on Linux: said, with the -S that splits them.
  s.write("/opts.sh", "#!/usr/bin/env python3 -u\n", 0755);
  CHECK(failure_code(s.dir + "/opts.sh", ProgramMode::kByName, {path.c_str()}, &message) == 127);
  CHECK_THAT(message, Contains("has env run 'python3 -u'") && Contains("#!/usr/bin/env -S python3 -u"));
  s.write("/split.sh", "#!/usr/bin/env -S python3 -u\n", 0755);
  CHECK(resolve_program(s.dir + "/split.sh", path.c_str()) == s.dir + "/split.sh");
  // A carriage return after the name, and a path that is not there.
  s.write("/dos.sh", "#!/usr/bin/env python3\r\n", 0755);
  CHECK(failure_code(s.dir + "/dos.sh", ProgramMode::kByName, {path.c_str()}, &message) == 127);
  CHECK_THAT(message, Contains("has env run 'python3\\r'") && Contains("Windows line endings"));
  s.write("/abs.sh", "#!/usr/bin/env /no/such/python\n", 0755);
  CHECK(failure_code(s.dir + "/abs.sh", ProgramMode::kByName, {path.c_str()}, &message) == 127);
  CHECK_THAT(message, Contains("has env run '/no/such/python', which does not exist"));
}

TEST_CASE("program_command: the active environment's python before PATH's, PYTHON_EXEC before both",
          "[program_command]") {
  const auto programs = [](const ProgramLookup& lookup) {
    std::vector<std::string> out;
    for (const PythonCandidate& c : python_candidates(lookup)) out.push_back(c.program + " (" + c.source + ")");
    return out;
  };
  CHECK(programs({"/bin"}) == Args{"python3 (python3 on PATH)", "python (python on PATH)"});
  CHECK(programs({"/bin", nullptr, "/v", "/c"}) ==
        Args{"/v/bin/python (VIRTUAL_ENV)", "/c/bin/python (CONDA_PREFIX)", "python3 (python3 on PATH)",
             "python (python on PATH)"});
  CHECK(programs({"/bin", "", "", "/c"}) ==
        Args{"/c/bin/python (CONDA_PREFIX)", "python3 (python3 on PATH)", "python (python on PATH)"});
  const std::vector<PythonCandidate> exec = python_candidates({"/bin", "/p/python", "/v", "/c"});
  REQUIRE(exec.size() == 1);  // torchrun's rule: PYTHON_EXEC alone
  CHECK(exec[0].program == "/p/python");
  CHECK(exec[0].chosen_by_user);

  Scratch s;
  mkdir((s.dir + "/venv").c_str(), 0755);
  mkdir((s.dir + "/venv/bin").c_str(), 0755);
  s.write("/venv/bin/python", "#!/bin/sh\n", 0755);
  const std::string path = s.bin();
  const std::string venv = s.dir + "/venv";
  const std::string conda = s.dir + "/nowhere";  // a prefix without bin/python
  const ProgramCommand c = resolve_program_command(s.dir + "/train.py", {}, ProgramMode::kByName,
                                                   {path.c_str(), nullptr, venv.c_str(), nullptr});
  CHECK(c.path == venv + "/bin/python");
  CHECK(c.python_source == "VIRTUAL_ENV");
  CHECK(python_choice_line("train.py", ProgramMode::kByName, c) ==
        "cpprun: running train.py with " + venv + "/bin/python (VIRTUAL_ENV)");
  CHECK(python_choice_line("pkg.train", ProgramMode::kModule, c) ==
        "cpprun: running -m pkg.train with " + venv + "/bin/python (VIRTUAL_ENV)");
  const ProgramCommand from_conda = resolve_program_command("m", {}, ProgramMode::kModule,
                                                            {path.c_str(), nullptr, nullptr, venv.c_str()});
  CHECK(from_conda.python_source == "CONDA_PREFIX");
  // An environment without a runnable bin/python is passed over, and said so.
  const ProgramCommand passed = resolve_program_command("m", {}, ProgramMode::kModule,
                                                        {path.c_str(), nullptr, conda.c_str(), nullptr});
  CHECK(passed.path == s.bin() + "/python3");
  CHECK(passed.python_source == "python3 on PATH; VIRTUAL_ENV=" + conda + " has no runnable bin/python");
  // PYTHON_EXEC still wins over an active environment.
  const std::string other = s.dir + "/other/python";
  CHECK(resolve_program_command("m", {}, ProgramMode::kModule, {path.c_str(), other.c_str(), venv.c_str()}).path ==
        other);
  std::string message;
  CHECK(failure_code("m", ProgramMode::kModule, {"/nonexistent", nullptr, conda.c_str()}, &message) == 127);
  CHECK_THAT(message, Contains("(PATH=/nonexistent; VIRTUAL_ENV=" + conda + " has no runnable bin/python)"));
}
