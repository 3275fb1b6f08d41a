// How long cpprun waits before restarting the workers after a failure: a delay that doubles with
// each failure in a row, up to a cap, and starts over after a healthy attempt. So a program that
// fails at once is not restarted in a tight loop (a tester saw 1,093 restarts in 10 s), while one
// that fails now and then after running a while restarts after the short initial delay. Pure.
#pragma once

#include <algorithm>
#include <chrono>

namespace cpprun::launcher {

// --restart_backoff=INITIAL[:MAX].
struct RestartBackoffSettings {
  // Before the first restart of a run of failures. 0: every restart at once (torchrun's behaviour).
  std::chrono::milliseconds initial{1000};
  // The cap. An attempt that ran at least this long was healthy: the next delay is `initial` again.
  // So once the delay has grown to the cap, attempts start at most once every `max`.
  std::chrono::milliseconds max{30000};
};

class RestartBackoff {
 public:
  explicit RestartBackoff(RestartBackoffSettings settings) : settings_(settings), next_(first()) {}

  // An attempt that ran for `ran` failed: the delay before the next attempt starts.
  std::chrono::milliseconds after_failure(std::chrono::milliseconds ran) {
    if (ran >= settings_.max) next_ = first();
    const std::chrono::milliseconds delay = next_;
    next_ = std::min(next_ * 2, settings_.max);
    return delay;
  }

 private:
  std::chrono::milliseconds first() const { return std::min(settings_.initial, settings_.max); }

  RestartBackoffSettings settings_;
  std::chrono::milliseconds next_;  // the delay after the next quick failure
};

}  // namespace cpprun::launcher
