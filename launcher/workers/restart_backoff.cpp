// The clock and the console around RestartBackoff.
#include "workers/restart_backoff.h"

#include <iostream>

#include "common/formatting.h"

namespace cpprun::launcher {

RestartPacer::Clock::time_point RestartPacer::restart_at(int restart, int max_restarts) {
  if (restart_at_) return *restart_at_;
  const Clock::time_point now = Clock::now();
  const std::chrono::milliseconds delay =
      backoff_.after_failure(std::chrono::duration_cast<std::chrono::milliseconds>(now - attempt_start_));
  restart_at_ = now + delay;
  if (delay.count() > 0) {
    const std::string max = decimal_seconds(settings_.max);
    std::cerr << "cpprun: restarting in " << decimal_seconds(delay) << " s (restart " << restart
              << " of --max_restarts=" << max_restarts << "; --restart_backoff=" << decimal_seconds(settings_.initial)
              << ":" << max << " doubles the wait after each attempt that fails within " << max << " s, up to " << max
              << " s)\n";
  }
  return *restart_at_;
}

}  // namespace cpprun::launcher
