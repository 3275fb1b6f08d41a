// Formatting of the failure summary (pure, unit-tested).
#include "workers/failure_report.h"

#include <sstream>

#include "workers/worker_status.h"

namespace cpprun::launcher {
namespace {

std::string seconds_text(std::chrono::milliseconds ms) {
  std::ostringstream out;
  out << static_cast<double>(ms.count()) / 1000.0 << "s";
  return out.str();
}

std::string fate(const WorkerRecord& w, std::chrono::milliseconds shutdown_timeout) {
  const std::string how = w.exit ? w.exit->describe() : "exit status unknown";
  switch (w.state) {
    case WorkerState::kRunning:
      return "still running";
    case WorkerState::kFinished:
      return w.exit && w.exit->succeeded() ? "had finished (exited with code 0)" : "also failed: " + how;
    case WorkerState::kStoppedByLauncher:
      return w.sent_sigkill ? "stopped: did not exit within --shutdown_timeout=" +
                                  seconds_text(shutdown_timeout) + ", " + how
                            : "stopped: " + how;
  }
  return how;
}

}  // namespace

std::string describe_worker(const WorkerRecord& worker) {
  return "rank " + std::to_string(worker.rank) + " (local_rank " + std::to_string(worker.local_rank) +
         ", pid " + std::to_string(worker.pid) + ")";
}

std::string format_attempt_summary(const std::vector<WorkerRecord>& workers, const AttemptSummary& summary) {
  std::ostringstream out;
  if (summary.ending_signal != 0) {
    out << "cpprun: received " << signal_name(summary.ending_signal)
        << "; forwarded it to every worker and stopped them\n";
  }
  if (summary.root_cause) {
    const WorkerRecord& root = workers.at(*summary.root_cause);
    out << "cpprun: " << describe_worker(root) << " failed first (root cause): "
        << (root.exit ? root.exit->describe() : "exit status unknown") << "\n";
  }
  for (std::size_t i = 0; i < workers.size(); ++i) {
    if (summary.root_cause && i == *summary.root_cause) continue;
    out << "cpprun:   " << describe_worker(workers[i]) << " " << fate(workers[i], summary.shutdown_timeout)
        << "\n";
  }
  if (!summary.root_cause) return out.str();
  // Last, next to the exit line: with many ranks, the root cause's own words scroll away.
  const std::string rank = "rank " + std::to_string(workers.at(*summary.root_cause).rank);
  if (!summary.root_cause_stderr_tail.empty()) {
    out << "cpprun: last lines of " << rank << "'s stderr:\n";
    for (const std::string& line : summary.root_cause_stderr_tail) out << "cpprun:   | " << line << "\n";
  }
  if (summary.root_cause_error_file) {
    out << "cpprun: " << rank << "'s error file (TORCHELASTIC_ERROR_FILE):\n";
    std::istringstream lines(*summary.root_cause_error_file);
    for (std::string line; std::getline(lines, line);) out << "cpprun:   | " << line << "\n";
  }
  return out.str();
}

}  // namespace cpprun::launcher
