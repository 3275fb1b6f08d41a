// Straggler lines on the real process group, under `cpprun --nproc_per_node=K`: the rank that
// sleeps before each all-reduce is named the slowest, and the others' wait for it is counted.
#include "catch.h"
#include <ATen/ATen.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "cpprun/cpprun.h"
#include "dist_test_support.h"

using dist_test::group;

TEST_CASE("step_timing: the rank that sleeps before each all_reduce is named the slowest", "[step_timing]") {
  const auto& g = group();
  const int world = g.size(), sleeper = world - 1;
  constexpr int kSteps = 5;
  constexpr auto kExtra = std::chrono::milliseconds(40);
  at::Tensor t = at::ones({1024});
  cpprun::barrier(g);
  cpprun::StepTimer timer;
  std::chrono::steady_clock::duration in_all_reduce{0};  // this rank's time inside the calls
  for (int step = 1; step <= kSteps; ++step) {
    if (world > 1 && g.rank() == sleeper) std::this_thread::sleep_for(kExtra);
    const auto entered = std::chrono::steady_clock::now();
    cpprun::all_reduce(g, t);  // Gloo, checked across ranks first: both waits count
    in_all_reduce += std::chrono::steady_clock::now() - entered;
    timer.step_done();
  }
  const auto report = timer.report(g);
  if (g.rank() == 0) std::printf("%s\n", cpprun::format_step_report(report).c_str());
  REQUIRE(report.ranks.size() == static_cast<size_t>(world));
  CHECK(report.first_step == 1);
  CHECK(report.last_step == kSteps);
  if (world > 1) {
    CHECK(cpprun::slowest_rank(report) == sleeper);
    // The sleep is compute: at least kExtra a step however loaded the machine (sleep_for never
    // returns early). Was 35 ms, below what cannot fail to hold.
    CHECK(report.ranks[sleeper].compute_ms >= 0.999 * kExtra.count());
    // Relative, not a fixed share of the 40 ms (was waiting_ms >= 25): on a loaded machine a rank
    // may itself come late to an all-reduce and so wait less. However long it waited, the report
    // must count its time blocked in the calls, measured here around them, as waiting: never more
    // (one thread waits), and most of it, less the calls' own work (the check's and Gloo's: well
    // under 1 ms a step here, and half of the time allows for a thread descheduled in between).
    const double mine_ms = std::chrono::duration<double, std::milli>(in_all_reduce).count() / kSteps;
    const auto& me = report.ranks[static_cast<size_t>(g.rank())];
    INFO("rank " << g.rank() << ": " << mine_ms << " ms a step in all_reduce, " << me.waiting_ms << " ms counted as waiting");
    CHECK(me.waiting_ms <= mine_ms + 0.01);
    if (g.rank() != sleeper) CHECK(me.waiting_ms >= 0.5 * mine_ms - 1.0);
  }

  // The next window starts after the exchange, and counts its own steps.
  for (int step = 1; step <= 3; ++step) {
    cpprun::all_reduce(g, t);
    timer.step_done();
  }
  const auto next = timer.report(g);
  CHECK(next.first_step == kSteps + 1);
  CHECK(next.last_step == kSteps + 3);
  CHECK(timer.steps_since_report() == 0);
}
