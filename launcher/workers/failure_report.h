// The few lines cpprun prints when an attempt ends badly: which worker failed first (the root
// cause) and how, and what became of the others.
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "workers/worker_status.h"

namespace cpprun::launcher {

struct AttemptSummary {
  std::optional<std::size_t> root_cause;  // index into the workers, when a worker failed
  int ending_signal = 0;                  // the signal cpprun received, when interrupted
  std::chrono::milliseconds shutdown_timeout{0};
  // Of the root cause: its last stderr lines, and its TORCHELASTIC_ERROR_FILE if it wrote one.
  std::vector<std::string> root_cause_stderr_tail;
  std::optional<std::string> root_cause_error_file;
};

// "rank 1 (local_rank 1, pid 4242)"
std::string describe_worker(const WorkerRecord& worker);

// One line per worker, then the root cause's stderr tail and error file; each line starting
// "cpprun: ", ending in '\n'.
std::string format_attempt_summary(const std::vector<WorkerRecord>& workers, const AttemptSummary& summary);

}  // namespace cpprun::launcher
