// How long cpprun waits before restarting the workers after a failure: a delay that doubles with
// each failure in a row, up to a cap, and starts over after a healthy attempt, so that a program that
// fails at once is not restarted in a tight loop (a tester saw 1,093 restarts in 10 s).
#pragma once

#include <algorithm>
#include <chrono>
#include <optional>
#include <string>

#include "command_line/restart_backoff_settings.h"

namespace cpprun::launcher {

// The delays alone, without a clock. Pure.
class RestartBackoff {
 public:
  explicit RestartBackoff(RestartBackoffSettings settings) : settings_(settings), next_(first()) {}
  RestartBackoff() : RestartBackoff(RestartBackoffSettings{}) {}  // the defaults, until a job's are known

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

// What cpprun says before it waits `delay` (above 0) for restart `restart` (from 1) of
// `max_restarts`: "cpprun: restarting in 2 s (restart 1 of --max_restarts=3; ...)", without a newline.
// Pure: the rendezvous host's step (rendezvous/round_decide.h) prints it as RestartPacer does.
std::string restart_wait_line(const RestartBackoffSettings& settings, std::chrono::milliseconds delay, int restart,
                              int max_restarts);

// The backoff on the clock. The agent hosting a multi-node rendezvous paces every node this way.
class RestartPacer {
 public:
  using Clock = std::chrono::steady_clock;

  explicit RestartPacer(RestartBackoffSettings settings)
      : backoff_(settings), settings_(settings), attempt_start_(Clock::now()) {}

  void attempt_started() {
    attempt_start_ = Clock::now();
    restart_at_.reset();
  }

  // The attempt failed and restart `restart` (from 1) of `max_restarts` is due: when it may start. The first
  // call after attempt_started() decides, printing "cpprun: restarting in 2 s ..." unless 0; later ones repeat it.
  Clock::time_point restart_at(int restart, int max_restarts);

 private:
  RestartBackoff backoff_;
  RestartBackoffSettings settings_;
  Clock::time_point attempt_start_;
  std::optional<Clock::time_point> restart_at_;  // this attempt's answer, once decided
};

}  // namespace cpprun::launcher
