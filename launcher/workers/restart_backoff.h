// How long cpprun waits before restarting the workers after a failure: a delay that doubles with
// each failure in a row, up to a cap, and starts over after a healthy attempt. A program that fails
// the moment it starts therefore cannot make cpprun restart it in a tight loop (a tester saw 1,093
// restarts in 10 s with a large --max_restarts), while a job that fails now and then after running a
// while is restarted after the short initial delay. Pure: unit-tested.
#pragma once

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
  explicit RestartBackoff(RestartBackoffSettings settings);

  // An attempt that ran for `ran` failed: the delay before the next attempt starts.
  std::chrono::milliseconds after_failure(std::chrono::milliseconds ran);

 private:
  RestartBackoffSettings settings_;
  std::chrono::milliseconds next_;  // the delay after the next quick failure
};

}  // namespace cpprun::launcher
