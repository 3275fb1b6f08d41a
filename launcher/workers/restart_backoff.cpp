// The clock and the console around RestartBackoff, and what the console is told.
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
  if (delay.count() > 0) std::cerr << restart_wait_line(settings_, delay, restart, max_restarts) << "\n";
  return *restart_at_;
}

std::string restart_wait_line(const RestartBackoffSettings& settings, std::chrono::milliseconds delay, int restart,
                              int max_restarts) {
  const std::string max = decimal_seconds(settings.max);
  return "cpprun: restarting in " + decimal_seconds(delay) + " s (restart " + std::to_string(restart) +
         " of --max_restarts=" + std::to_string(max_restarts) + "; --restart_backoff=" +
         decimal_seconds(settings.initial) + ":" + max + " doubles the wait after each attempt that fails within " +
         max + " s, up to " + max + " s)";
}

}  // namespace cpprun::launcher
