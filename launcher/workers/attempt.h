// One attempt of this node's workers: start and supervise them, stop the rest and print the failure
// summary unless all succeeded, and stop what they left behind (Note [The job's process tree]).
// The caller's loop (single- or multi-node) decides what comes next.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <vector>

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
// ended badly, before the workers are stopped, so other nodes hear of it at once.
AttemptEnd run_attempt(SignalRelay& relay, const std::vector<WorkerSpec>& specs,
                       std::chrono::milliseconds shutdown_timeout,
                       PeerEvents* peers, const std::function<void(const AttemptEnd&)>& before_stop);

// What the failure summary says besides the workers' records.
struct AttemptSummary {
  std::optional<std::size_t> root_cause;  // index into the workers, when a worker failed
  int ending_signal = 0;                  // the signal cpprun received, when interrupted
  std::chrono::milliseconds shutdown_timeout{0};
  // Of the root cause: its last stderr lines, and its TORCHELASTIC_ERROR_FILE if it wrote one.
  std::vector<std::string> root_cause_stderr_tail;
  std::optional<std::string> root_cause_error_file;
};

// One line per worker, then the root cause's stderr tail and error file; each line starting
// "cpprun: ", ending in '\n'. Pure.
std::string format_attempt_summary(const std::vector<WorkerRecord>& workers, const AttemptSummary& summary);

}  // namespace cpprun::launcher
