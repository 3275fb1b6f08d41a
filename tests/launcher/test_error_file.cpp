// Unit tests of the error-file hand-over: errorCode set as torch's ErrorHandler.dump_error_file does.
#include "catch.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "workers/error_file.h"

using namespace cpprun::launcher;

namespace {

std::string read_all(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

TEST_CASE("error_file: errorCode is set in the message object, as torch's dump_error_file", "[error_file]") {
  // What torch's @record writes (ErrorHandler.record_exception).
  const std::string record =
      R"({"message": {"message": "ValueError: bad {x}, \"quoted\"", "extraInfo": {"py_callstack": "a\nb", )"
      R"("timestamp": "1700000000"}}})";
  CHECK(with_error_code(record, 3) ==
        R"({"message": {"message": "ValueError: bad {x}, \"quoted\"", "extraInfo": {"py_callstack": "a\nb", )"
        R"("timestamp": "1700000000"}, "errorCode": 3}})");
  // A signal is torch's negative exit code; an errorCode already there is replaced.
  CHECK(with_error_code(R"({"message":{"errorCode":1,"m":[1,2]}})", -9) == R"({"message":{"errorCode":-9,"m":[1,2]}})");
  CHECK(with_error_code(R"({"message": {}})", 2) == R"({"message": {"errorCode": 2}})");
  // 0, a string message (torch's "new format") and bad JSON: copied unchanged.
  CHECK(with_error_code(record, 0) == record);
  CHECK(with_error_code(R"({"message": "text"})", 3) == R"({"message": "text"})");
  CHECK(with_error_code(R"({"message": {"a": )", 3) == R"({"message": {"a": )");
  CHECK(with_error_code("not json", 3) == "not json");
}

TEST_CASE("error_file: the worker's file is copied into the launcher's, only when it exists", "[error_file]") {
  char dir_pattern[] = "/tmp/cpprun-error-file-XXXXXX";
  REQUIRE(mkdtemp(dir_pattern) != nullptr);
  const std::string dir = dir_pattern;
  const std::string worker = dir + "/worker.json";
  const std::string mine = dir + "/launcher.json";
  CHECK(copy_root_error_file(worker, mine, 1).empty());  // no worker file: nothing written
  CHECK_FALSE(std::ifstream(mine).good());
  std::ofstream(worker) << R"({"message": {"message": "E"}})";
  std::ofstream(mine) << "an older file";
  CHECK(copy_root_error_file(worker, mine, 1).empty());
  CHECK(read_all(mine) == R"({"message": {"message": "E", "errorCode": 1}})");
  CHECK(copy_root_error_file(worker, "", 1).empty());  // the launcher has no TORCHELASTIC_ERROR_FILE
  CHECK_THAT(copy_root_error_file(worker, dir + "/missing/x.json", 1),
             Catch::Matchers::Contains("TORCHELASTIC_ERROR_FILE=" + dir + "/missing/x.json"));
  std::system(("rm -rf '" + dir + "'").c_str());
}
