// Start, wait, stop and summarise one attempt of this node's workers.
#include "workers/attempt.h"

#include <csignal>
#include <iostream>

#include "workers/failure_report.h"
#include "workers/job_process_tree.h"
#include "workers/run_directory.h"

namespace cpprun::launcher {
namespace {

// The root cause's error file, shown in full up to this size.
constexpr std::size_t kErrorFileLimit = 16 * 1024;

}  // namespace

AttemptEnd run_attempt(SignalRelay& relay, const std::vector<WorkerSpec>& specs,
                       std::chrono::milliseconds shutdown_timeout,
                       PeerEvents* peers, const std::function<void(const AttemptEnd&)>& before_stop) {
  WorkerGroup group(relay);
  group.start(specs, shutdown_timeout);
  const GroupOutcome outcome = group.wait(peers);
  AttemptEnd result;
  result.end = outcome.end;
  if (outcome.end == GroupEnd::kSucceeded) {
    // See Note [The job's process tree]. A job-ending signal that cut the grace short is raised
    // again, for whatever waits next (the exit barrier of a multi-node job) to act on.
    if (const int sig = stop_leftovers(relay, shutdown_timeout); sig != 0) raise(sig);
    return result;
  }
  if (outcome.root_cause) {
    const WorkerRecord& root = group.workers().at(*outcome.root_cause);
    result.root_worker = describe_worker(root);
    result.root_how = root.exit->describe();
    result.exit_code = root.exit->launcher_exit_code();
  }
  if (outcome.end == GroupEnd::kInterrupted) {
    result.signal = outcome.signal;
    result.exit_code = 128 + outcome.signal;
  }
  if (before_stop) before_stop(result);

  group.stop(outcome.end == GroupEnd::kInterrupted ? StopStart::kAlreadySignalled : StopStart::kSendSigterm,
             shutdown_timeout);
  AttemptSummary summary;
  summary.root_cause = outcome.root_cause;
  summary.ending_signal = group.ending_signal();
  summary.shutdown_timeout = shutdown_timeout;
  if (outcome.root_cause) {
    summary.root_cause_stderr_tail = group.stderr_tail(*outcome.root_cause);
    summary.root_cause_error_file = read_file_head(specs.at(*outcome.root_cause).error_file, kErrorFileLimit);
  }
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

}  // namespace cpprun::launcher
