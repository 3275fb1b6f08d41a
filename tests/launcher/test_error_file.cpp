// Unit tests of the error-file hand-over: errorCode set as torch's ErrorHandler.dump_error_file does.
#include "catch.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "support/json.h"
#include "workers/attempt.h"
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
  // A worker's file that is not JSON was copied as it was: a scheduler reading the launcher's file
  // then failed to parse it. torchrun's holds its own error (JSONDecodeError) instead.
  std::ofstream(worker) << "not json{";
  CHECK(copy_root_error_file(worker, mine, 4).empty());
  const std::string said = read_all(mine);
  CHECK_NOTHROW(cpprun::detail::parse_json(said, 8));
  CHECK_THAT(said, Catch::Matchers::StartsWith(R"({"message": {"message": "cpprun: the root cause's error file )" +
                                               worker + " is not JSON (") &&
                       Catch::Matchers::Contains("the worker's exit code was 4"));
  // What Python's json.load reads and cpprun's strict parser does not is copied as torchrun copies
  // it: NaN, a repeated key, a lone surrogate escape (json.dump's for a path that is not UTF-8).
  const std::string lenient = R"({"message": {"message": "E \udc80 {", "extraInfo": {"x": NaN, "x": 1}}})";
  std::ofstream(worker) << lenient;
  CHECK(copy_root_error_file(worker, mine, 1).empty());
  CHECK(read_all(mine) == R"({"message": {"message": "E \udc80 {", "extraInfo": {"x": NaN, "x": 1}, "errorCode": 1}})");
  std::ofstream(worker) << R"({"message": {"message": "cut short)";
  CHECK(copy_root_error_file(worker, mine, 1).empty());
  CHECK_THAT(read_all(mine), Catch::Matchers::Contains("is not JSON ("));
  std::ofstream(worker) << R"({"message": {"message": "E"}})";
  CHECK(copy_root_error_file(worker, "", 1).empty());  // the launcher has no TORCHELASTIC_ERROR_FILE
  CHECK_THAT(copy_root_error_file(worker, dir + "/missing/x.json", 1),
             Catch::Matchers::Contains("TORCHELASTIC_ERROR_FILE=" + dir + "/missing/x.json"));
  std::system(("rm -rf '" + dir + "'").c_str());
}

TEST_CASE("error_file: the time cpprun::record says the worker failed at", "[error_file]") {
  const std::string cpprun_record =
      R"({"message": {"message": "std::invalid_argument: bad {flag}", "extraInfo": {"timestamp": "1796315292", )"
      R"("cpprun_failed_at_ms": "1796315292123", "rank": "0", "py_callstack": "x"}}})";
  CHECK(recorded_failure_ms(cpprun_record) == 1796315292123LL);
  // torch's @record has whole seconds only: no time to order by.
  CHECK_FALSE(recorded_failure_ms(R"({"message": {"message": "E", "extraInfo": {"timestamp": "1700000000"}}})"));
  for (const char* bad : {"", "not json", R"({"message": "a string"})", R"({"message": {"extraInfo": []}})",
                          R"({"message": {"extraInfo": {"cpprun_failed_at_ms": 12}}})",
                          R"({"message": {"extraInfo": {"cpprun_failed_at_ms": "-12"}}})",
                          R"({"message": {"extraInfo": {"cpprun_failed_at_ms": "99999999999999999999"}}})",
                          R"({"message": {"extraInfo": {"cpprun_failed_at_ms": "12"}})"}) {  // cut short
    INFO(bad);
    CHECK_FALSE(recorded_failure_ms(bad));
  }
  // A worker wrote it: nesting a million deep is refused, not followed down the launcher's stack.
  CHECK_FALSE(recorded_failure_ms("{\"message\": " + std::string(1000000, '[')));
  CHECK_FALSE(with_error_code("{\"message\": {\"x\": " + std::string(1000000, '{'), 3).empty());
}

TEST_CASE("error_file: the root cause is the worker that reported first, when both reported",
          "[error_file]") {
  using Times = std::vector<std::optional<long long>>;
  // Rank 1 exited first, but rank 0 reported 40 ms earlier: its error ended rank 1's collective.
  CHECK(root_cause_by_report_time(1, Times{1000, 1040}) == 0);
  CHECK(root_cause_by_report_time(0, Times{1000, 1040}) == 0);
  CHECK(root_cause_by_report_time(2, Times{1003, std::nullopt, 1005, 1001}) == 3);
  CHECK(root_cause_by_report_time(1, Times{1000, 1000}) == 1);  // a tie keeps the first to exit
  // The first to exit recorded nothing (killed by a signal, torch's @record): it stays the root
  // cause, whatever the others reported after its end.
  CHECK(root_cause_by_report_time(1, Times{1000, std::nullopt}) == 1);
  CHECK(root_cause_by_report_time(0, Times{}) == 0);
}

// Note [The launcher's own failure in its error file]: torch's record_exception layout, the text
// escaped as JSON (a program name may hold quotes, a message newlines).
TEST_CASE("error_file: the launcher's own failure in torch's layout", "[error_file]") {
  CHECK(launcher_error_json("cpprun: cannot run PROGRAM 'a\"b': no such file\n\t", 1764806400) ==
        "{\"message\": {\"message\": \"cpprun: cannot run PROGRAM 'a\\\"b': no such file\\u000a\\u0009\", "
        "\"extraInfo\": {\"py_callstack\": \"\", \"timestamp\": \"1764806400\"}}}\n");
  CHECK(launcher_error_json("back\\slash", 0).find("\"back\\\\slash\"") != std::string::npos);
}

TEST_CASE("error_file: an attempt ended by a worker stuck in D state is recorded as the launcher's failure",
          "[error_file]") {
  char dir[] = "/tmp/cpprun_error_file_XXXXXX";
  REQUIRE(mkdtemp(dir) != nullptr);
  const std::string mine = std::string(dir) + "/launcher.json";
  const char* saved = std::getenv("TORCHELASTIC_ERROR_FILE");
  const std::optional<std::string> before = saved ? std::optional<std::string>(saved) : std::nullopt;
  setenv("TORCHELASTIC_ERROR_FILE", mine.c_str(), 1);
  AttemptEnd unhealthy;
  unhealthy.end = GroupEnd::kUnhealthy;
  unhealthy.exit_code = 1;
  unhealthy.root_worker = "rank 1 (local_rank 1, pid 42)";
  unhealthy.root_how = "stuck in uninterruptible sleep (D state) for 1.0 s";
  hand_over_error_file(unhealthy);
  const std::string text = read_all(mine);
  if (before) {
    setenv("TORCHELASTIC_ERROR_FILE", before->c_str(), 1);
  } else {
    unsetenv("TORCHELASTIC_ERROR_FILE");
  }
  CHECK(text.rfind("{\"message\": {\"message\": \"cpprun: rank 1 (local_rank 1, pid 42) stuck in uninterruptible sleep "
                   "(D state) for 1.0 s; the workers were stopped, with no restart\"", 0) == 0);
  std::remove(mine.c_str());
  rmdir(dir);
}
