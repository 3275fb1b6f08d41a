// Start, wait, stop and summarise one attempt of this node's workers.
#include "workers/attempt.h"

#include <csignal>
#include <iostream>
#include <sstream>

#include "workers/job_process_tree.h"
#include "workers/run_directory.h"

namespace cpprun::launcher {
namespace {

// The root cause's error file, shown in full up to this size.
constexpr std::size_t kErrorFileLimit = 16 * 1024;

std::string seconds_text(std::chrono::milliseconds ms) {
  std::ostringstream out;
  out << static_cast<double>(ms.count()) / 1000.0 << "s";
  return out.str();
}

std::string fate(const WorkerRecord& w, std::chrono::milliseconds shutdown_timeout) {
  const std::string how = w.exit ? w.exit->describe() : "exit status unknown";
  if (w.state == WorkerState::kRunning) return "still running";
  if (w.state == WorkerState::kFinished) {
    return w.exit && w.exit->succeeded() ? "had finished (exited with code 0)" : "also failed: " + how;
  }
  if (!w.sent_sigkill) return "stopped: " + how;
  return "stopped: did not exit within --shutdown_timeout=" + seconds_text(shutdown_timeout) + ", " + how;
}

// "rank 1 (local_rank 1, pid 4242)"
std::string describe_worker(const WorkerRecord& worker) {
  return "rank " + std::to_string(worker.rank) + " (local_rank " + std::to_string(worker.local_rank) +
         ", pid " + std::to_string(worker.pid) + ")";
}

}  // namespace

AttemptEnd run_attempt(SignalRelay& relay, const std::vector<WorkerSpec>& specs,
                       std::chrono::milliseconds shutdown_timeout,
                       PeerEvents* peers, const std::function<void(const AttemptEnd&)>& before_stop) {
  WorkerGroup group(relay);
  group.start(specs, shutdown_timeout);
  const GroupOutcome outcome = group.wait(peers);
  if (outcome.end == GroupEnd::kSucceeded) {
    // See Note [The job's process tree]. A job-ending signal that cut the grace short is raised
    // again, for whatever waits next (the exit barrier of a multi-node job) to act on.
    if (const int sig = stop_leftovers(relay, shutdown_timeout); sig != 0) raise(sig);
    return {};
  }
  AttemptEnd result{outcome.end, 0, outcome.signal, "", ""};
  if (outcome.root_cause) {
    const WorkerRecord& root = group.workers().at(*outcome.root_cause);
    result.root_worker = describe_worker(root);
    result.root_how = root.exit->describe();
    result.exit_code = root.exit->launcher_exit_code();
  }
  if (outcome.end == GroupEnd::kInterrupted) result.exit_code = 128 + outcome.signal;
  if (before_stop) before_stop(result);

  group.stop(outcome.end == GroupEnd::kInterrupted ? StopStart::kAlreadySignalled : StopStart::kSendSigterm,
             shutdown_timeout);
  const std::optional<std::size_t> root = outcome.root_cause;
  const AttemptSummary summary{root, group.ending_signal(), shutdown_timeout,
                               root ? group.stderr_tail(*root) : std::vector<std::string>{},
                               root ? read_file_head(specs.at(*root).error_file, kErrorFileLimit) : std::nullopt};
  std::cerr << format_attempt_summary(group.workers(), summary);
  const int leftovers_signal = stop_leftovers(relay, shutdown_timeout);
  // A signal that arrived while stopping after a failure still means "do not restart".
  const int late_signal = group.ending_signal() != 0 ? group.ending_signal() : leftovers_signal;
  if (late_signal != 0) {
    result.end = GroupEnd::kInterrupted;
    result.signal = late_signal;
    result.exit_code = 128 + result.signal;
  }
  return result;
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
