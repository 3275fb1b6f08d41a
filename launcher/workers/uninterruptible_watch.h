// Which workers have stayed in uninterruptible sleep (Linux D state) too long: torchrun 2.15's
// TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT check (local_elastic_agent.py
// _check_uninterruptible_state_timeout) as a pure step over the states observed at each tick. The
// attempt (attempt.cpp) reads /proc/PID/stat and acts on the step's answer.
//
// Note [Time in D state]
// As torchrun measures it: per worker process (the one cpprun started, not its children), from the
// first tick that saw it in D (state letter 'D' in /proc/PID/stat) while every later tick saw it in
// D too. A tick that sees another state forgets it; a tick that cannot read the state (the process
// is exiting) neither forgets nor counts it; a worker reaped since is forgotten. So a dwell is at
// least one tick long, and one seen only between ticks is never counted. Unlike torchrun's, a tick
// that comes more than max(2 x --monitor_interval, 1 s) after the one before forgets every dwell
// first: cpprun's loop was held up (answering `cpprun --diagnose`, say), so two D samples far apart
// say nothing of the time between. The 1 s floor keeps a short hiccup under a tiny
// --monitor_interval from starting every dwell over, so that the check still fires on a busy host.
//
// torchrun warns each time a tick first sees a worker in D (local_elastic_agent.py
// _update_uninterruptible_dwell), again after every tick out of it: a worker often briefly in D
// (reading files on NFS) fills the console. cpprun warns once per worker per attempt.
#pragma once

#include <sys/types.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace cpprun::launcher {

// One running worker at one tick.
struct ProcessStateSample {
  pid_t pid = -1;
  std::optional<char> state;  // /proc/PID/stat's state letter; nullopt when it could not be read
};

class UninterruptibleWatch {
 public:
  using Clock = std::chrono::steady_clock;

  // `timeout_s` > 0 (TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT); `interval` the ticks' period (--monitor_interval).
  UninterruptibleWatch(double timeout_s, std::chrono::milliseconds interval)
      : timeout_s_(timeout_s), max_gap_(std::max<Clock::duration>(2 * interval, std::chrono::seconds(1))) {}

  struct Stuck {
    pid_t pid = -1;
    double dwell_s = 0;  // continuously in D this long, at least the timeout
  };
  struct Step {
    std::vector<pid_t> entered;  // seen in D for the first time this attempt: worth a warning
    std::vector<Stuck> stuck;    // not empty: the workers are unhealthy
  };

  // One tick at `now` over the samples of the workers still running (not yet reaped).
  Step observe(const std::vector<ProcessStateSample>& running, Clock::time_point now);

  // Forgets every dwell: after a job-control stop (Ctrl-Z) cpprun did not watch, and a worker whose
  // child was stopped in vfork() shows D while stopped.
  void forget_all() { first_seen_.clear(); }

  double timeout_s() const { return timeout_s_; }

 private:
  double timeout_s_;
  Clock::duration max_gap_;  // a longer gap between ticks forgets every dwell
  std::optional<Clock::time_point> last_tick_;
  std::map<pid_t, Clock::time_point> first_seen_;  // workers in D at every tick since this time
  std::set<pid_t> warned_;                         // workers already said to have entered D
};

// /proc/PID/stat's state letter: after the last ')', as COMM may hold spaces and parentheses;
// nullopt for text that is not a stat line (or empty: the process is gone). Pure.
std::optional<char> parse_stat_state(const std::string& stat);

// The lines cpprun prints, `worker` as "rank 1 (local_rank 1, pid 4242)". Pure.
std::string entered_uninterruptible_line(const std::string& worker, double timeout_s);
std::string stuck_uninterruptible_how(double dwell_s, double timeout_s);  // "stuck in ... for 1.0 s (...)"
// The error line for a stuck worker: `how` (as above), what it waits in (`wchan`, /proc/PID/wchan's
// text: a kernel function; "" or "0" when the kernel does not say) and what to do about it. Pure.
std::string stuck_uninterruptible_error(const std::string& worker, pid_t pid, const std::string& how,
                                        const std::string& wchan);

}  // namespace cpprun::launcher
