// The clock and the console around RestartBackoff.
#include "workers/restart_backoff.h"

#include <iostream>
#include <string>

namespace cpprun::launcher {
namespace {

// "2", "0.25"
std::string seconds(std::chrono::milliseconds ms) {
  std::string text = std::to_string(ms.count() / 1000);
  if (const long long millis = ms.count() % 1000; millis != 0) {
    std::string fraction = std::to_string(millis + 1000).substr(1);
    while (fraction.back() == '0') fraction.pop_back();
    text += "." + fraction;
  }
  return text;
}

}  // namespace

RestartPacer::Clock::time_point RestartPacer::restart_at(int restart, int max_restarts) {
  if (decided_) return restart_at_;
  const Clock::time_point now = Clock::now();
  const std::chrono::milliseconds delay =
      backoff_.after_failure(std::chrono::duration_cast<std::chrono::milliseconds>(now - attempt_start_));
  decided_ = true;
  restart_at_ = now + delay;
  if (delay.count() > 0) {
    const std::string max = seconds(settings_.max);
    std::cerr << "cpprun: restarting in " << seconds(delay) << " s (restart " << restart << " of --max_restarts="
              << max_restarts << "; --restart_backoff=" << seconds(settings_.initial) << ":" << max
              << " doubles the wait after each attempt that fails within " << max << " s, up to " << max << " s)\n";
  }
  return restart_at_;
}

}  // namespace cpprun::launcher
