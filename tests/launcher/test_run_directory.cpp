// Unit tests of the run directory: torchrun's layout, a temp dir that leaves nothing behind, a
// --log_dir that stays, and reading back error files.
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "workers/run_directory.h"

using namespace cpprun::launcher;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;

namespace {

bool exists(const std::string& path) {
  struct stat info {};
  return stat(path.c_str(), &info) == 0;
}

// A private scratch dir for one test case, removed with everything in it.
struct Scratch {
  std::string path;
  Scratch() {
    char pattern[] = "/tmp/cpprun-unit.XXXXXX";
    REQUIRE(mkdtemp(pattern) != nullptr);
    path = pattern;
  }
  ~Scratch() { std::system(("rm -rf '" + path + "'").c_str()); }
};

}  // namespace

TEST_CASE("run_directory: torchrun's attempt_N/LOCAL_RANK layout, flat in the temp dir", "[run_directory]") {
  const RunLayout log_dir{"logs", true};
  CHECK(log_dir.worker_dir(2, 3) == "logs/attempt_2/3");
  CHECK(log_dir.error_file(0, 1) == "logs/attempt_0/1/error.json");
  const RunLayout temp{"/tmp/cpprun-x", false};
  CHECK(temp.error_file(1, 3) == "/tmp/cpprun-x/attempt_1.3.error.json");
}

TEST_CASE("run_directory: without --log_dir, a temp dir under TMPDIR that is removed", "[run_directory]") {
  Scratch scratch;
  const char* saved = std::getenv("TMPDIR");
  const std::string saved_value = saved != nullptr ? saved : "";
  setenv("TMPDIR", scratch.path.c_str(), 1);
  std::string path;
  {
    const RunDirectory dir("");
    path = dir.layout().dir;
    CHECK_THAT(path, StartsWith(scratch.path + "/cpprun-"));
    CHECK_FALSE(dir.layout().per_worker_dirs);
    dir.prepare_attempt(0, 2);
    std::ofstream(dir.layout().error_file(0, 1)) << "{}";  // a worker that failed
    CHECK(exists(dir.layout().error_file(0, 1)));
  }
  if (saved != nullptr) setenv("TMPDIR", saved_value.c_str(), 1); else unsetenv("TMPDIR");
  CHECK_FALSE(exists(path));
}

TEST_CASE("run_directory: a --log_dir is created with its parents and kept", "[run_directory]") {
  Scratch scratch;
  const std::string log_dir = scratch.path + "/a/b";
  const RunLayout layout{log_dir, true};
  {
    const RunDirectory dir(log_dir);
    CHECK(dir.layout().dir == log_dir);
    CHECK(dir.layout().per_worker_dirs);
    dir.prepare_attempt(1, 1);
    // A stale error file from an earlier run is not this attempt's.
    std::ofstream(layout.error_file(1, 0)) << "stale";
    dir.prepare_attempt(1, 1);
    CHECK_FALSE(exists(layout.error_file(1, 0)));
  }
  CHECK(exists(log_dir + "/attempt_1/0"));
}

TEST_CASE("run_directory: an unusable --log_dir names itself", "[run_directory]") {
  Scratch scratch;
  std::ofstream(scratch.path + "/file") << "x";
  REQUIRE_THROWS_WITH(RunDirectory(scratch.path + "/file/sub"),
                      Contains("--log_dir=" + scratch.path + "/file/sub") && Contains("cannot create"));
}

TEST_CASE("run_directory: error files are read up to a limit", "[run_directory]") {
  Scratch scratch;
  const std::string file = scratch.path + "/error.json";
  CHECK_FALSE(read_file_head(file, 10).has_value());
  std::ofstream(file) << "0123456789abc";
  CHECK(read_file_head(file, 100).value() == "0123456789abc");
  CHECK_THAT(read_file_head(file, 10).value(), StartsWith("0123456789\n") && Contains("cut at 10 bytes"));
}
