// Unit tests of the D-state watch (TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT): the dwell per worker
// as torchrun 2.15 measures it (local_elastic_agent.py), the variable's resolution, /proc parsing.
#include "catch.h"

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "command_line/uninterruptible_state_settings.h"
#include "workers/uninterruptible_watch.h"

using namespace cpprun::launcher;
using std::chrono::milliseconds;

namespace {

using Clock = UninterruptibleWatch::Clock;
constexpr milliseconds kTick{100};  // --monitor_interval's default

ProcessStateSample in(pid_t pid, char state) { return {pid, state}; }
ProcessStateSample unreadable(pid_t pid) { return {pid, std::nullopt}; }

std::vector<pid_t> stuck_pids(const UninterruptibleWatch::Step& step) {
  std::vector<pid_t> pids;
  for (const auto& s : step.stuck) pids.push_back(s.pid);
  return pids;
}

}  // namespace

TEST_CASE("uninterruptible_watch: a worker in D from its first tick is stuck once the timeout has passed",
          "[uninterruptible_watch]") {
  UninterruptibleWatch watch(1.0, kTick);
  const Clock::time_point t0{};
  const auto first = watch.observe({in(10, 'D'), in(11, 'S')}, t0);
  CHECK(first.entered == std::vector<pid_t>{10});  // warned once, with a dwell of 0
  CHECK(first.stuck.empty());
  const auto later = watch.observe({in(10, 'D'), in(11, 'S')}, t0 + milliseconds(999));
  CHECK(later.entered.empty());
  CHECK(later.stuck.empty());
  const auto at = watch.observe({in(10, 'D'), in(11, 'R')}, t0 + milliseconds(1000));  // >=, as torchrun
  REQUIRE(stuck_pids(at) == std::vector<pid_t>{10});
  CHECK(at.stuck[0].dwell_s == Approx(1.0));
}

TEST_CASE("uninterruptible_watch: a tick out of D starts the dwell over; unreadable ticks neither count nor reset",
          "[uninterruptible_watch]") {
  UninterruptibleWatch watch(1.0, kTick);
  const Clock::time_point t0{};
  watch.observe({in(10, 'D')}, t0);
  CHECK(watch.observe({in(10, 'R')}, t0 + milliseconds(500)).stuck.empty());
  const auto again = watch.observe({in(10, 'D')}, t0 + milliseconds(900));
  CHECK(again.entered.empty());  // a new dwell, but warned of once per worker per attempt (torchrun: again)
  CHECK(watch.observe({in(10, 'D')}, t0 + milliseconds(1800)).stuck.empty());
  // Unreadable (exiting): not stuck at that tick, but the dwell since 900 ms still stands after it.
  CHECK(watch.observe({unreadable(10)}, t0 + milliseconds(1950)).stuck.empty());
  CHECK(stuck_pids(watch.observe({in(10, 'D')}, t0 + milliseconds(1900) + milliseconds(100))) == std::vector<pid_t>{10});
}

TEST_CASE("uninterruptible_watch: each worker has its own dwell; a reaped one is forgotten",
          "[uninterruptible_watch]") {
  UninterruptibleWatch watch(2.0, kTick);
  const Clock::time_point t0{};
  watch.observe({in(10, 'D'), in(11, 'S'), in(12, 'D')}, t0);
  watch.observe({in(10, 'D'), in(11, 'D'), in(12, 'D')}, t0 + milliseconds(1000));
  // 10 and 12 have 2 s, 11 only 1 s: those stuck come in the samples' order.
  const auto step = watch.observe({in(12, 'D'), in(11, 'D'), in(10, 'D')}, t0 + milliseconds(2000));
  CHECK(stuck_pids(step) == std::vector<pid_t>{12, 10});
  // 10 was reaped (not among the running): a process that later has its pid starts from nothing.
  watch.observe({in(11, 'D'), in(12, 'D')}, t0 + milliseconds(2100));
  const auto reused = watch.observe({in(10, 'D')}, t0 + milliseconds(5000));
  CHECK(reused.entered == std::vector<pid_t>{10});
  CHECK(reused.stuck.empty());
}

TEST_CASE("uninterruptible_watch: forget_all (a job-control stop) starts every dwell over", "[uninterruptible_watch]") {
  UninterruptibleWatch watch(1.0, kTick);
  const Clock::time_point t0{};
  watch.observe({in(10, 'D')}, t0);
  watch.forget_all();
  const auto after = watch.observe({in(10, 'D')}, t0 + milliseconds(900));
  CHECK(after.entered.empty());  // already warned of
  CHECK(after.stuck.empty());
  CHECK(stuck_pids(watch.observe({in(10, 'D')}, t0 + milliseconds(1900))) == std::vector<pid_t>{10});
}

TEST_CASE("uninterruptible_watch: a tick long after the one before (a held-up loop) starts every dwell over",
          "[uninterruptible_watch]") {
  const Clock::time_point t0{};
  SECTION("more than max(2 x interval, 1 s) apart: two D samples say nothing of the time between") {
    UninterruptibleWatch watch(2.0, kTick);
    watch.observe({in(10, 'D')}, t0);
    CHECK(watch.observe({in(10, 'D')}, t0 + milliseconds(3000)).stuck.empty());  // a 3 s gap: from 3 s now
    CHECK(watch.observe({in(10, 'D')}, t0 + milliseconds(3900)).stuck.empty());
    CHECK(watch.observe({in(10, 'D')}, t0 + milliseconds(4800)).stuck.empty());
    CHECK(stuck_pids(watch.observe({in(10, 'D')}, t0 + milliseconds(5000))) == std::vector<pid_t>{10});
  }
  SECTION("with a long --monitor_interval, twice it is the limit") {
    UninterruptibleWatch watch(5.0, milliseconds(2000));
    watch.observe({in(10, 'D')}, t0);
    watch.observe({in(10, 'D')}, t0 + milliseconds(4000));  // 2 x 2 s: still one dwell
    CHECK(stuck_pids(watch.observe({in(10, 'D')}, t0 + milliseconds(6000))) == std::vector<pid_t>{10});
    UninterruptibleWatch late(5.0, milliseconds(2000));
    late.observe({in(10, 'D')}, t0);
    late.observe({in(10, 'D')}, t0 + milliseconds(4001));  // just over: starts over
    CHECK(late.observe({in(10, 'D')}, t0 + milliseconds(6000)).stuck.empty());
  }
  SECTION("a short hiccup under a tiny interval does not (1 s floor)") {
    UninterruptibleWatch watch(1.0, milliseconds(1));
    watch.observe({in(10, 'D')}, t0);
    watch.observe({in(10, 'D')}, t0 + milliseconds(300));
    CHECK(stuck_pids(watch.observe({in(10, 'D')}, t0 + milliseconds(1000))) == std::vector<pid_t>{10});
  }
}

TEST_CASE("uninterruptible_watch: a worker often briefly in D is warned of once", "[uninterruptible_watch]") {
  UninterruptibleWatch watch(10.0, kTick);
  const Clock::time_point t0{};
  std::size_t warnings = 0;
  for (int tick = 0; tick < 20; ++tick) {
    warnings += watch.observe({in(10, tick % 2 == 0 ? 'D' : 'S'), in(11, 'D')}, t0 + tick * kTick).entered.size();
  }
  CHECK(warnings == 2);  // 10 and 11, once each
}

TEST_CASE("uninterruptible_watch: the state letter follows the last ')' of /proc/PID/stat", "[uninterruptible_watch]") {
  CHECK(parse_stat_state("4242 (python3) D 1 4242 4242 0 -1") == 'D');
  CHECK(parse_stat_state("4242 (a) b (c) S 1 4242") == 'S');  // COMM "a) b (c"
  CHECK(parse_stat_state("4242 (x)) R 1") == 'R');
  CHECK_FALSE(parse_stat_state(""));  // gone
  CHECK_FALSE(parse_stat_state("4242 (x)"));
  CHECK_FALSE(parse_stat_state("garbage"));
}

TEST_CASE("uninterruptible_watch: TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT resolves as torchrun's float()",
          "[uninterruptible_watch]") {
  CHECK(resolve_uninterruptible_state_timeout(std::nullopt) == 0);
  CHECK(resolve_uninterruptible_state_timeout("") == 0);
  CHECK(resolve_uninterruptible_state_timeout("abc") == 0);  // unparsable: off, no error
  CHECK(resolve_uninterruptible_state_timeout("0") == 0);
  CHECK(resolve_uninterruptible_state_timeout("-5") == 0);
  CHECK(resolve_uninterruptible_state_timeout("nan") == 0);
  CHECK(resolve_uninterruptible_state_timeout("0x10") == 0);  // Python's float() refuses hexadecimal
  CHECK(resolve_uninterruptible_state_timeout("2s") == 0);
  CHECK(resolve_uninterruptible_state_timeout("2.5") == 2.5);
  CHECK(resolve_uninterruptible_state_timeout(" 3 \n") == 3);
  CHECK(resolve_uninterruptible_state_timeout("1e1") == 10);
  CHECK(resolve_uninterruptible_state_timeout("1_0") == 10);  // as float("1_0")
  CHECK(resolve_uninterruptible_state_timeout("_10") == 0);
  CHECK(resolve_uninterruptible_state_timeout("inf") > 1e300);
  const UninterruptibleStateSettings off;
  CHECK_FALSE(off.enabled());
}

TEST_CASE("uninterruptible_watch: the lines name the worker, the dwell and the variable", "[uninterruptible_watch]") {
  CHECK(entered_uninterruptible_line("rank 1 (local_rank 1, pid 42)", 30) ==
        "cpprun: warning: rank 1 (local_rank 1, pid 42) entered uninterruptible sleep (D state); the workers are "
        "stopped if it stays there 30.0 s (TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT)");
  CHECK(stuck_uninterruptible_error("rank 1 (local_rank 1, pid 42)", 42, "stuck in X", "nfs_wait_bit_killable") ==
        "cpprun: error: rank 1 (local_rank 1, pid 42) stuck in X, waiting in the kernel in nfs_wait_bit_killable "
        "(/proc/42/wchan); stopping the workers, with no restart. If this was slow I/O (e.g. a checkpoint write on "
        "NFS), raise or unset TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT; otherwise check the driver or mount it "
        "waits on");
  for (const std::string hidden : {"", "0"}) {
    CHECK_THAT(stuck_uninterruptible_error("rank 1", 42, "stuck in X", hidden),
               Catch::Matchers::Contains("rank 1 stuck in X (/proc/42/wchan does not say where); stopping"));
  }
  CHECK(stuck_uninterruptible_how(30.04, 30) ==
        "stuck in uninterruptible sleep (D state) for 30.0 s (>= 30.0 s, TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT)");
}
