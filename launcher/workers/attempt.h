// One attempt of this node's workers: start them, supervise them until the attempt ends, and
// unless they all succeeded, stop the rest and print the failure summary. Either way, whatever the
// workers left behind is stopped before it returns (Note [The job's process tree]). The single-node loop
// (main.cpp) and the multi-node one (multi_node_agent.cpp) decide what comes next.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "workers/signal_relay.h"
#include "workers/worker_group.h"

namespace cpprun::launcher {

struct AttemptEnd {
  GroupEnd end = GroupEnd::kSucceeded;
  int exit_code = 0;        // what cpprun exits with for it: the root cause's code, or 128+signal
  int signal = 0;           // kInterrupted: the job-ending signal cpprun received (maybe while stopping)
  std::string root_worker;  // kWorkerFailed: "rank 1 (local_rank 1, pid 4242)"
  std::string root_how;     // kWorkerFailed: "exited with code 3"
};

// `peers` (multi-node) may end the attempt too; `before_stop`, if set, runs once the attempt has
// ended badly and before the workers are stopped, so other nodes can hear of it at once. Stopping
// gives SIGTERM `shutdown_timeout` (--shutdown_timeout) before SIGKILL.
AttemptEnd run_attempt(SignalRelay& relay, const std::vector<WorkerSpec>& specs,
                       std::chrono::milliseconds shutdown_timeout,
                       PeerEvents* peers, const std::function<void(const AttemptEnd&)>& before_stop);

}  // namespace cpprun::launcher
