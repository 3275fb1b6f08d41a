// The D-state dwell of each worker, tick by tick (Note [Time in D state]).
#include "workers/uninterruptible_watch.h"

#include <algorithm>
#include <cstdio>
#include <set>

namespace cpprun::launcher {
namespace {

// "1.0", as torchrun's %.1f.
std::string one_decimal(double seconds) {
  char text[64];
  std::snprintf(text, sizeof text, "%.1f", seconds);
  return text;
}

}  // namespace

UninterruptibleWatch::Step UninterruptibleWatch::observe(const std::vector<ProcessStateSample>& running,
                                                        Clock::time_point now) {
  if (last_tick_ && now - *last_tick_ > max_gap_) first_seen_.clear();  // Note [Time in D state]
  last_tick_ = now;
  std::set<pid_t> live;
  for (const ProcessStateSample& sample : running) live.insert(sample.pid);
  for (auto it = first_seen_.begin(); it != first_seen_.end();) {
    it = live.count(it->first) != 0 ? std::next(it) : first_seen_.erase(it);
  }
  // A reaped worker is gone for the attempt: a process that later has its pid is another one.
  for (auto it = warned_.begin(); it != warned_.end();) it = live.count(*it) != 0 ? std::next(it) : warned_.erase(it);
  Step step;
  for (const ProcessStateSample& sample : running) {
    if (!sample.state) continue;  // unreadable: neither in D nor out of it
    if (*sample.state != 'D') {
      first_seen_.erase(sample.pid);
      continue;
    }
    const auto [it, inserted] = first_seen_.emplace(sample.pid, now);
    if (inserted) {
      if (warned_.insert(sample.pid).second) step.entered.push_back(sample.pid);
      continue;  // a dwell of 0 never reaches a positive timeout
    }
    const double dwell = std::chrono::duration<double>(now - it->second).count();
    if (dwell >= timeout_s_) step.stuck.push_back({sample.pid, dwell});
  }
  return step;
}

std::optional<char> parse_stat_state(const std::string& stat) {
  const auto close = stat.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  const auto state = stat.find_first_not_of(' ', close + 1);
  if (state == std::string::npos) return std::nullopt;
  return stat[state];
}

std::string entered_uninterruptible_line(const std::string& worker, double timeout_s) {
  return "cpprun: warning: " + worker + " entered uninterruptible sleep (D state); the workers are stopped if it "
         "stays there " + one_decimal(timeout_s) + " s (TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT)";
}

std::string stuck_uninterruptible_how(double dwell_s, double timeout_s) {
  return "stuck in uninterruptible sleep (D state) for " + one_decimal(dwell_s) + " s (>= " + one_decimal(timeout_s) +
         " s, TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT)";
}

std::string stuck_uninterruptible_error(const std::string& worker, pid_t pid, const std::string& how,
                                        const std::string& wchan) {
  const bool known = !wchan.empty() && wchan != "0";
  return "cpprun: error: " + worker + " " + how + (known ? ", waiting in the kernel in " + wchan : "") +
         " (/proc/" + std::to_string(pid) + "/wchan" + (known ? "" : " does not say where") +
         "); stopping the workers, with no restart. If this was slow I/O (e.g. a checkpoint write on NFS), raise or "
         "unset TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT; otherwise check the driver or mount it waits on";
}

}  // namespace cpprun::launcher
