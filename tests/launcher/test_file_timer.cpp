// Unit tests of the file timer: torch's FileTimerClient requests and FileTimerServer's expiry rules.
#include "catch.h"

#include <signal.h>

#include <string>

#include "workers/file_timer.h"

using namespace cpprun::launcher;

TEST_CASE("file_timer: the pipe exists only when TORCHELASTIC_ENABLE_FILE_TIMER=1", "[file_timer]") {
  CHECK_FALSE(file_timer_path(std::nullopt, std::nullopt, "/tmp", "u"));
  CHECK_FALSE(file_timer_path(std::string("0"), std::string("/x"), "/tmp", "u"));
  CHECK_FALSE(file_timer_path(std::string("true"), std::nullopt, "/tmp", "u"));  // torch compares with "1"
  CHECK(file_timer_path(std::string("1"), std::nullopt, "/t", "u") == "/t/watchdog_timer_u");
  CHECK(file_timer_path(std::string("1"), std::string("/run/w"), "/t", "u") == "/run/w");
}

TEST_CASE("file_timer: FileTimerClient's JSON lines are read", "[file_timer]") {
  // FileTimerRequest.to_json()'s layout.
  const auto r = parse_file_timer_request(
      R"({"version": 1, "pid": 4242, "scope_id": "step", "expiration_time": 1700000000.25, "signal": 9})");
  REQUIRE(r);
  CHECK(r->pid == 4242);
  CHECK(r->scope_id == "step");
  CHECK(r->expiration_time == 1700000000.25);
  CHECK(r->signal == SIGKILL);
  const auto release = parse_file_timer_request(R"({"pid":7,"scope_id":"s","expiration_time":-1,"signal":0})");
  REQUIRE(release);
  CHECK(release->expiration_time < 0);
  CHECK_FALSE(parse_file_timer_request(R"({"pid": 7, "scope_id": "s"})"));
  CHECK_FALSE(parse_file_timer_request(R"({"pid": "x", "scope_id": "s", "expiration_time": 1, "signal": 9})"));
  CHECK_FALSE(parse_file_timer_request(R"({"pid": 0, "scope_id": "s", "expiration_time": 1, "signal": 9})"));
  CHECK_FALSE(parse_file_timer_request("not json"));
}

TEST_CASE("file_timer: expired timers name the pid, the first signal and every scope", "[file_timer]") {
  FileTimerTable table;
  table.apply({10, "a", 100.0, SIGTERM});
  table.apply({10, "b", 90.0, 0});  // no signal: the next expired one's is used
  table.apply({11, "a", 200.0, SIGKILL});
  table.apply({12, "a", 50.0, SIGKILL});
  table.apply({12, "a", -1, 0});  // released
  CHECK(table.size() == 3);
  CHECK(table.take_expired(80.0).empty());
  const auto expired = table.take_expired(150.0);
  REQUIRE(expired.size() == 1);
  CHECK(expired[0].pid == 10);
  CHECK(expired[0].signal == SIGTERM);
  CHECK(expired[0].scopes == std::vector<std::string>{"b", "a"});
  CHECK(table.size() == 1);  // pid 10's timers are gone
  // Re-acquiring a scope replaces its timer.
  table.apply({11, "a", 300.0, SIGKILL});
  CHECK(table.take_expired(250.0).empty());
  CHECK(table.take_expired(300.0).size() == 1);
}
