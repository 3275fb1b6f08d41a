// Unit tests of the wait after SIGKILL and of which processes cpprun then gives up on (workers/kill_wait.h).
#include "catch.h"

#include <chrono>
#include <set>
#include <vector>

#include "workers/kill_wait.h"

using namespace cpprun::launcher;
using std::chrono::milliseconds;
using std::chrono::seconds;

TEST_CASE("kill_wait: the wait after SIGKILL is --shutdown_timeout, never less than torchrun's 30 s", "[kill_wait]") {
  CHECK(wait_after_sigkill(milliseconds(0)) == seconds(30));  // --shutdown_timeout=0 still waits
  CHECK(wait_after_sigkill(seconds(5)) == seconds(30));       // cpprun's default 5 s
  CHECK(wait_after_sigkill(seconds(30)) == seconds(30));      // torchrun's default
  CHECK(wait_after_sigkill(seconds(90)) == seconds(90));
}

TEST_CASE("kill_wait: before the deadline it waits while any is live; at it, the live ones are given up on",
          "[kill_wait]") {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point t0{};
  const Clock::time_point deadline = t0 + seconds(30);
  const std::vector<pid_t> killed{10, 11, 12};

  const AfterKill early = decide_after_kill(killed, {11}, deadline, t0 + seconds(29));
  CHECK(early.keep_waiting);
  CHECK(early.abandon.empty());

  const AfterKill all_ended = decide_after_kill(killed, {}, deadline, t0 + seconds(1));
  CHECK_FALSE(all_ended.keep_waiting);
  CHECK(all_ended.abandon.empty());

  // At the deadline (>=) the live ones, in the order they were killed; a live pid not killed is not ours to judge.
  const AfterKill late = decide_after_kill(killed, {12, 10, 99}, deadline, deadline);
  CHECK_FALSE(late.keep_waiting);
  CHECK(late.abandon == std::vector<pid_t>{10, 12});

  CHECK(decide_after_kill({}, {10}, deadline, deadline + seconds(1)).abandon.empty());
}
