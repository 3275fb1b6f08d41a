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
  for (int step = 1; step <= kSteps; ++step) {
    if (world > 1 && g.rank() == sleeper) std::this_thread::sleep_for(kExtra);
    cpprun::all_reduce(g, t);  // Gloo, checked across ranks first: both waits count
    timer.step_done();
  }
  const auto report = timer.report(g);
  if (g.rank() == 0) std::printf("%s\n", cpprun::format_step_report(report).c_str());
  REQUIRE(report.ranks.size() == static_cast<size_t>(world));
  CHECK(report.first_step == 1);
  CHECK(report.last_step == kSteps);
  if (world > 1) {
    CHECK(cpprun::slowest_rank(report) == sleeper);
    CHECK(report.ranks[sleeper].compute_ms >= 35);
    for (const auto& r : report.ranks) {
      if (r.rank != sleeper) CHECK(r.waiting_ms >= 25);  // it waited for the sleeper, each step
    }
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
