// What TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT and --monitor_interval ask of the workers' watch
// (workers/uninterruptible_watch.h). Apart from it because the command line fills it in and may not
// include workers/.
#pragma once

#include <chrono>
#include <optional>
#include <string>

namespace cpprun::launcher {

struct UninterruptibleStateSettings {
  // Seconds a worker may stay in uninterruptible sleep (Linux D state) before the attempt is ended
  // as unhealthy, without a restart. 0: the check is off (torchrun's default).
  double timeout_s = 0;
  // How often the workers' /proc/PID/stat is read while the check is on: --monitor_interval.
  std::chrono::milliseconds interval{100};
  bool enabled() const { return timeout_s > 0; }
};

// TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT as torchrun 2.15 resolves it
// (local_elastic_agent.py _resolve_uninterruptible_state_timeout): unset, empty, not a number
// (Python's float(): surrounding blanks allowed, "inf" and "nan" too) or not positive: 0, off. Pure.
double resolve_uninterruptible_state_timeout(const std::optional<std::string>& raw);

// The note cpprun prints when the variable is set to something that leaves the check off (torchrun
// says nothing): "" when it is unset, empty or positive. Pure.
std::string uninterruptible_state_timeout_note(const std::optional<std::string>& raw);

}  // namespace cpprun::launcher
