// Straggler lines: the process's time waiting for collectives, the per-rank exchange of step
// times, and the line that names the slowest rank.
#include "cpprun/step_timing.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cstdio>

#include "comm/collective_wait.h"
#include "cpprun/collectives.h"

namespace cpprun {
namespace {

// Relaxed: a sum read now and then, ordering nothing.
std::atomic<int64_t> waited_ns{0};

using FractionalMillis = std::chrono::duration<double, std::milli>;

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t mid = values.size() / 2;
  return values.size() % 2 ? values[mid] : (values[mid - 1] + values[mid]) / 2;
}

std::string printf_string(const char* format, double a, double b) {
  char text[96];
  std::snprintf(text, sizeof text, format, a, b);
  return text;
}

// Ranks beyond this many are summarised (median, the slowest few), so a line stays a line.
constexpr size_t kRanksListed = 8;
constexpr size_t kSlowestListed = 3;

}  // namespace

namespace detail {
void add_collective_wait(std::chrono::nanoseconds waited) {
  waited_ns.fetch_add(waited.count(), std::memory_order_relaxed);
}
}  // namespace detail

std::chrono::nanoseconds time_waiting_for_collectives() {
  return std::chrono::nanoseconds(waited_ns.load(std::memory_order_relaxed));
}

// ---- StepTimer -----------------------------------------------------------------------------

StepTimer::StepTimer()
    : window_start_(std::chrono::steady_clock::now()),
      last_step_(window_start_),
      waiting_at_start_(time_waiting_for_collectives()),
      waiting_at_last_step_(waiting_at_start_) {}

void StepTimer::step_done() {
  ++steps_done_;
  last_step_ = std::chrono::steady_clock::now();
  waiting_at_last_step_ = time_waiting_for_collectives();
}

StepReport StepTimer::report(const ProcessGroup& group) {
  const int64_t steps = steps_since_report();
  const double wall_ms = steps ? FractionalMillis(last_step_ - window_start_).count() : 0;
  const double waiting_ms = steps ? FractionalMillis(waiting_at_last_step_ - waiting_at_start_).count() : 0;
  at::Tensor mine = at::tensor({static_cast<double>(steps), wall_ms, waiting_ms}, at::kDouble);
  at::Tensor all = at::empty({3 * static_cast<int64_t>(group.size())}, at::kDouble);
  all_gather_into(group, all, mine);
  const double* data = all.data_ptr<double>();
  const std::vector<double> per_rank(data, data + all.numel());
  const int64_t first_step = reported_ + 1;
  // The exchange's own wait is not the next window's.
  reported_ = steps_done_;
  window_start_ = std::chrono::steady_clock::now();
  waiting_at_start_ = time_waiting_for_collectives();
  return make_step_report(first_step, per_rank);
}

// ---- decisions -----------------------------------------------------------------------------

StepReport make_step_report(int64_t first_step, const std::vector<double>& per_rank) {
  TORCH_INTERNAL_ASSERT(per_rank.size() % 3 == 0, "step report: ", per_rank.size(), " numbers, not 3 a rank");
  const int world = static_cast<int>(per_rank.size() / 3);
  StepReport report;
  report.first_step = first_step;
  report.last_step = first_step - 1;
  if (world == 0) return report;
  const double steps = per_rank[0];
  for (int r = 1; r < world; ++r) {
    TORCH_CHECK(per_rank[3 * r] == steps, "cpprun::StepTimer::report: rank 0 timed ", steps, " steps since its last "
                "report but rank ", r, " timed ", per_rank[3 * r], ". Call step_done() once a step and report() "
                "after the same number of steps on every rank (e.g. every K steps).");
  }
  if (steps <= 0) return report;
  report.last_step = first_step + static_cast<int64_t>(steps) - 1;
  for (int r = 0; r < world; ++r) {
    RankStepTime t;
    t.rank = r;
    t.waiting_ms = per_rank[3 * r + 2] / steps;
    // Waits summed over threads can exceed the wall time where several threads wait at once.
    t.compute_ms = std::max(0.0, per_rank[3 * r + 1] / steps - t.waiting_ms);
    report.ranks.push_back(t);
  }
  return report;
}

int slowest_rank(const StepReport& report) {
  int slowest = -1;
  double most = -1;
  for (const auto& t : report.ranks) {
    if (t.compute_ms > most) most = t.compute_ms, slowest = t.rank;
  }
  return slowest;
}

std::string format_step_report(const StepReport& report) {
  std::string line = "steps " + std::to_string(report.first_step) + "-" + std::to_string(report.last_step) + ": ";
  if (report.ranks.empty()) return line + "none since the last report";
  line += "per step, ";
  auto rank_figures = [&](const RankStepTime& t, bool first) {
    return "rank " + std::to_string(t.rank) +
           printf_string(first ? " compute %.1f ms + waiting %.1f ms" : " compute %.1f + %.1f", t.compute_ms, t.waiting_ms);
  };
  std::vector<double> computes, waits;
  for (const auto& t : report.ranks) computes.push_back(t.compute_ms), waits.push_back(t.waiting_ms);
  if (report.ranks.size() <= kRanksListed) {
    for (size_t i = 0; i < report.ranks.size(); ++i) line += (i ? "; " : "") + rank_figures(report.ranks[i], i == 0);
  } else {
    line += printf_string("median compute %.1f ms + waiting %.1f ms", median(computes), median(waits));
    std::vector<RankStepTime> by_compute = report.ranks;
    std::stable_sort(by_compute.begin(), by_compute.end(),
                     [](const RankStepTime& a, const RankStepTime& b) { return a.compute_ms > b.compute_ms; });
    line += "; most compute: ";
    for (size_t i = 0; i < kSlowestListed; ++i) line += (i ? ", " : "") + rank_figures(by_compute[i], false);
  }
  if (report.ranks.size() < 2) return line;
  const int slowest = slowest_rank(report);
  std::vector<double> others;
  for (const auto& t : report.ranks) {
    if (t.rank != slowest) others.push_back(t.compute_ms);
  }
  const double typical = median(others), own = report.ranks[static_cast<size_t>(slowest)].compute_ms;
  line += "; slowest: rank " + std::to_string(slowest);
  // Both: a percentage alone misleads where the others compute almost nothing (waiting on I/O).
  if (typical > 0) line += printf_string(" (%+.0f%% compute, %+.1f ms a step)", 100 * (own - typical) / typical, own - typical);
  return line;
}

}  // namespace cpprun
