// The clock and the console around RestartBackoff.
#include "workers/restart_backoff.h"

#include <iostream>

namespace cpprun::launcher {

std::string decimal_seconds(std::chrono::milliseconds ms) {
  std::string fraction = std::to_string(ms.count() % 1000 + 1000).substr(1);  // "050" for 1.05 s
  fraction.erase(fraction.find_last_not_of('0') + 1);
  return std::to_string(ms.count() / 1000) + (fraction.empty() ? "" : "." + fraction);
}

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
