// Straggler lines: each rank's time per step in compute and in waiting for collectives, so a
// slow rank shows up by name. Every K steps:
//
//   cpprun::StepTimer timer;
//   for (int step = 1; step <= steps; ++step) {
//     ...forward, backward, optimizer step...
//     timer.step_done();
//     if (step % 50 == 0) {
//       auto report = timer.report(group);  // a collective: every rank calls it
//       if (group.rank() == 0) std::puts(cpprun::format_step_report(report).c_str());
//     }
//   }
//
// prints e.g. "steps 51-100: per step, rank 0 compute 41.2 ms + waiting 3.1 ms; rank 1 compute
// 55.0 + 0.2; slowest: rank 1 (+34% compute, +13.8 ms a step)". See docs/launcher.md, "Stragglers".
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "cpprun/process_group.h"

namespace cpprun {

// How long, since the process started, its threads have spent blocked in Work::wait() (every
// blocking collective too) and in the cross-rank check before a collective (CPPRUN_CHECK_COLLECTIVES):
// the time a rank waits for the others. Summed over threads. On CUDA, NCCL's wait() returns
// once the stream is ordered, without blocking the host, so this counts only Gloo's waits.
std::chrono::nanoseconds time_waiting_for_collectives();

// One rank's average over a report's steps.
struct RankStepTime {
  int rank = 0;
  double compute_ms = 0;  // wall time less waiting_ms
  double waiting_ms = 0;  // blocked in collectives (time_waiting_for_collectives)
};

// Every rank's time per step over steps first_step..last_step (counted from 1 since the timer
// was made). Empty `ranks`: no step since the last report.
struct StepReport {
  int64_t first_step = 0;
  int64_t last_step = 0;
  std::vector<RankStepTime> ranks;  // in rank order
};

// Counts steps and reads the wall clock and the waiting counter at each; report() exchanges the
// ranks' figures since the last report.
class StepTimer {
 public:
  StepTimer();  // the first window starts now
  // The end of a step: the window a report covers ends at the last step_done() before it, so
  // whatever runs between (evaluation, a checkpoint, the report itself) is left out.
  void step_done();
  int64_t steps_since_report() const { return steps_done_ - reported_; }
  // A collective over `group` (one small all-gather; every rank calls it after the same number
  // of steps): every rank gets every rank's figures. The next window starts when it returns.
  StepReport report(const ProcessGroup& group);

 private:
  int64_t steps_done_ = 0, reported_ = 0;
  std::chrono::steady_clock::time_point window_start_, last_step_;
  std::chrono::nanoseconds waiting_at_start_{0}, waiting_at_last_step_{0};
};

// ---- decisions, apart from the exchange (unit-tested) ----

// Builds a report from what each rank sent: three numbers a rank, in rank order: steps, wall
// milliseconds and waiting milliseconds over those steps. Refuses ranks that disagree on steps.
StepReport make_step_report(int64_t first_step, const std::vector<double>& per_rank);

// The rank with the most compute per step (the lowest rank among equals); -1 when none.
int slowest_rank(const StepReport& report);

// One line: every rank's figures (up to 8 ranks; beyond, the median and the 3 slowest), then
// the slowest rank and how much more it computes than the median of the others (in % and ms).
std::string format_step_report(const StepReport& report);

}  // namespace cpprun
