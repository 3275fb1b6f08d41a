// Unit tests of PROGRAM resolution: execvp's PATH rules, the shell's 126/127.
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "command_line/program_command.h"

using namespace cpprun::launcher;
using Catch::Matchers::Contains;

namespace {

int failure_code(const std::string& program, const char* path) {
  try {
    resolve_program(program, path);
  } catch (const ProgramNotRunnable& e) {
    return e.exit_code();
  }
  return 0;
}

}  // namespace

TEST_CASE("program_lookup: searches PATH in order, uses paths as given", "[program_lookup]") {
  CHECK(resolve_program("sh", "/nonexistent:/bin:/usr/bin") == "/bin/sh");
  CHECK(resolve_program("/bin/sh", "/nonexistent") == "/bin/sh");
  CHECK(resolve_program("sh", nullptr) == "/bin/sh");  // unset PATH: execvp's default
}

TEST_CASE("program_lookup: missing is 127, not executable is 126, with the name", "[program_lookup]") {
  CHECK(failure_code("no-such-program-cpprun", "/bin:/usr/bin") == 127);
  CHECK(failure_code("./no-such-program-cpprun", "/bin") == 127);
  char plain_file[] = "/tmp/cpprun-test-lookup.XXXXXX";
  const int fd = mkstemp(plain_file);  // mode 0600: exists, not executable
  REQUIRE(fd >= 0);
  close(fd);
  const int code = failure_code(plain_file, "/bin");
  unlink(plain_file);
  CHECK(code == 126);
  CHECK(failure_code("/bin", "/bin") == 126);           // a directory
  REQUIRE_THROWS_WITH(resolve_program("no-such-program-cpprun", "/bin"),
                      Contains("'no-such-program-cpprun'") && Contains("PATH=/bin"));
}
