// Straggler lines without ranks: the report built from what the ranks send, the slowest rank,
// the line, and the waiting counter a blocking wait advances.
#include "catch.h"

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "comm/collective_wait.h"
#include "cpprun/step_timing.h"

using Catch::Matchers::Contains;

TEST_CASE("step_timing: per-step compute is wall less waiting, averaged over the window", "[step_timing]") {
  // Two ranks, 50 steps: rank 0 2060 ms wall of which 155 ms waiting, rank 1 2760 ms and 10 ms.
  const auto report = cpprun::make_step_report(101, {50, 2060, 155, 50, 2760, 10});
  CHECK(report.first_step == 101);
  CHECK(report.last_step == 150);
  REQUIRE(report.ranks.size() == 2);
  CHECK(report.ranks[0].compute_ms == Approx(38.1));
  CHECK(report.ranks[0].waiting_ms == Approx(3.1));
  CHECK(report.ranks[1].compute_ms == Approx(55.0));
  CHECK(report.ranks[1].waiting_ms == Approx(0.2));
  CHECK(cpprun::slowest_rank(report) == 1);
  CHECK(cpprun::format_step_report(report) ==
        "steps 101-150: per step, rank 0 compute 38.1 ms + waiting 3.1 ms; rank 1 compute 55.0 + 0.2; "
        "slowest: rank 1 (+44% compute, +16.9 ms a step)");
}

TEST_CASE("step_timing: the slowest rank is the one computing most, against the others' median", "[step_timing]") {
  // Rank 2 waits least and computes most; ranks 0, 1, 3 compute 40 ms, rank 2 60 ms: +50%.
  const auto report = cpprun::make_step_report(1, {10, 450, 50, 10, 460, 60, 10, 605, 5, 10, 430, 30});
  CHECK(cpprun::slowest_rank(report) == 2);
  CHECK_THAT(cpprun::format_step_report(report), Contains("slowest: rank 2 (+50% compute, +20.0 ms a step)"));
  // Equal ranks: the lowest is named, +0%.
  const auto even = cpprun::make_step_report(1, {10, 100, 0, 10, 100, 0});
  CHECK(cpprun::slowest_rank(even) == 0);
  CHECK_THAT(cpprun::format_step_report(even), Contains("slowest: rank 0 (+0% compute, +0.0 ms a step)"));
}

TEST_CASE("step_timing: one rank, no steps, and waits longer than the wall", "[step_timing]") {
  const auto alone = cpprun::make_step_report(1, {4, 40, 0});
  CHECK(cpprun::format_step_report(alone) == "steps 1-4: per step, rank 0 compute 10.0 ms + waiting 0.0 ms");
  const auto none = cpprun::make_step_report(51, {0, 0, 0, 0, 0, 0});
  CHECK(none.ranks.empty());
  CHECK(cpprun::slowest_rank(none) == -1);
  CHECK(cpprun::format_step_report(none) == "steps 51-50: none since the last report");
  // Two threads waiting at once sum to more than the wall time: compute is 0, not negative.
  const auto threads = cpprun::make_step_report(1, {1, 10, 15, 1, 10, 0});
  CHECK(threads.ranks[0].compute_ms == 0);
}

TEST_CASE("step_timing: many ranks are summarised by the median and the slowest three", "[step_timing]") {
  std::vector<double> sent;
  for (int r = 0; r < 16; ++r) {
    const double compute = r == 11 ? 90 : r == 5 ? 70 : r == 7 ? 60 : 40;
    sent.insert(sent.end(), {1, compute + 2, 2});
  }
  const std::string line = cpprun::format_step_report(cpprun::make_step_report(1, sent));
  CHECK(line ==
        "steps 1-1: per step, median compute 40.0 ms + waiting 2.0 ms; most compute: rank 11 compute 90.0 + 2.0, "
        "rank 5 compute 70.0 + 2.0, rank 7 compute 60.0 + 2.0; slowest: rank 11 (+125% compute, +50.0 ms a step)");
}

TEST_CASE("step_timing: ranks that timed different numbers of steps are refused by name", "[step_timing]") {
  CHECK_THROWS_WITH(cpprun::make_step_report(1, {50, 100, 0, 49, 100, 0}),
                    Contains("rank 0 timed 50 steps") && Contains("rank 1 timed 49"));
}

TEST_CASE("step_timing: a wait adds its time to the counter once, nested or not", "[step_timing]") {
  using namespace std::chrono;
  const auto before = cpprun::time_waiting_for_collectives();
  const auto start = steady_clock::now();
  {
    cpprun::detail::CollectiveWaitScope outer;
    cpprun::detail::CollectiveWaitScope inner;  // Work::then's chain: counted by the outer one only
    std::this_thread::sleep_for(milliseconds(20));
  }
  const auto elapsed = steady_clock::now() - start;
  const auto waited = cpprun::time_waiting_for_collectives() - before;
  CHECK(waited >= milliseconds(20));
  CHECK(waited <= elapsed);  // counted twice, it would be about twice the elapsed time
}
