// The restart backoff (restart_backoff.h) applied to a job's attempts: when the running attempt
// started, how long the next restart waits, and the wait. The agent hosting a multi-node
// rendezvous paces every node this way (the others wait for its start message).
#pragma once

#include <chrono>

#include "workers/restart_backoff.h"
#include "workers/signal_relay.h"

namespace cpprun::launcher {

class RestartPacer {
 public:
  using Clock = std::chrono::steady_clock;

  explicit RestartPacer(RestartBackoffSettings settings);

  // An attempt starts now; how long it runs decides whether its failure restarts the backoff.
  void attempt_started();

  // The attempt failed and restart `restart` (from 1) of `max_restarts` is due: when it may start.
  // The first call after attempt_started() picks the delay and, unless it is 0, prints
  // "cpprun: restarting in 2 s (restart 3 of --max_restarts=5; ...)"; later calls return the same.
  Clock::time_point restart_at(int restart, int max_restarts);

 private:
  RestartBackoff backoff_;
  RestartBackoffSettings settings_;
  Clock::time_point attempt_start_;
  bool decided_ = false;  // restart_at_ holds this attempt's answer
  Clock::time_point restart_at_;
};

// Sleeps in poll() on the relay until `when`. Returns the job-ending signal that cut the wait short
// (see ends_job), or 0; other signals are dropped, as no worker runs meanwhile.
int sleep_until(SignalRelay& relay, RestartPacer::Clock::time_point when);

}  // namespace cpprun::launcher
