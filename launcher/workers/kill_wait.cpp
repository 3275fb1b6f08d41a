// The wait after SIGKILL (Note [The wait after SIGKILL] in kill_wait.h).
#include "workers/kill_wait.h"

#include <algorithm>

namespace cpprun::launcher {

std::chrono::milliseconds wait_after_sigkill(std::chrono::milliseconds shutdown_timeout) {
  return std::max(shutdown_timeout, kTorchrunKillWait);
}

AfterKill decide_after_kill(const std::vector<pid_t>& killed, const std::set<pid_t>& live,
                            std::chrono::steady_clock::time_point deadline, std::chrono::steady_clock::time_point now) {
  AfterKill next;
  std::vector<pid_t> still;
  for (pid_t pid : killed) {
    if (live.count(pid) != 0) still.push_back(pid);
  }
  if (still.empty()) return next;
  if (now < deadline) {
    next.keep_waiting = true;
  } else {
    next.abandon = std::move(still);
  }
  return next;
}

}  // namespace cpprun::launcher
