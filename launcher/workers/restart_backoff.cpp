// Doubling delays with a cap, reset by a healthy attempt.
#include "workers/restart_backoff.h"

#include <algorithm>

namespace cpprun::launcher {

RestartBackoff::RestartBackoff(RestartBackoffSettings settings)
    : settings_(settings), next_(std::min(settings.initial, settings.max)) {}

std::chrono::milliseconds RestartBackoff::after_failure(std::chrono::milliseconds ran) {
  if (ran >= settings_.max) next_ = std::min(settings_.initial, settings_.max);
  const std::chrono::milliseconds delay = next_;
  next_ = std::min(next_ * 2, settings_.max);
  return delay;
}

}  // namespace cpprun::launcher
