// How long cpprun waits for what it SIGKILLed, and which of those it then gives up on (Note [A worker
// SIGKILL cannot end] in attempt.cpp). Decisions only: the callers send the signals and read /proc.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <set>
#include <vector>

namespace cpprun::launcher {

// Note [The wait after SIGKILL]
// torchrun 2.15 waits `timeout` after the SIGKILL (multiprocessing/api.py SubprocessContext._close:
// handler.proc.wait(timeout), then "abandoning and continuing teardown"), for each worker still
// there in turn. The timeout is 30 s when a failed or unhealthy attempt's workers are stopped, for a
// restart or not (agent/server/local_elastic_agent.py _stop_workers calls _shutdown() with its
// default timeout=30, whatever --shutdown_timeout says), and --shutdown_timeout (default 30) when a
// signal ends the job. A worker tearing down a large CUDA context or writing a core dump can take
// seconds after SIGKILL; giving up on it sooner would start a restart beside a dying worker that
// still holds GPU memory and ports. So cpprun waits --shutdown_timeout after SIGKILL, never less
// than torchrun's 30 s, for workers and leftovers alike, and for all of them at once.
constexpr std::chrono::milliseconds kTorchrunKillWait{30000};

// Note [The wait after SIGKILL]: max(shutdown_timeout, 30 s). Pure.
std::chrono::milliseconds wait_after_sigkill(std::chrono::milliseconds shutdown_timeout);

struct AfterKill {
  bool keep_waiting = false;   // some are still live and the deadline is not reached yet
  std::vector<pid_t> abandon;  // still live at the deadline: given up on, in `killed`'s order
};

// `killed` were SIGKILLed with `deadline` to end by; `live` holds those not ended (nor zombies) at
// `now` (other pids in it are ignored). Pure.
AfterKill decide_after_kill(const std::vector<pid_t>& killed, const std::set<pid_t>& live,
                            std::chrono::steady_clock::time_point deadline, std::chrono::steady_clock::time_point now);

}  // namespace cpprun::launcher
