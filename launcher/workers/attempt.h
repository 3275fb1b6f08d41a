// One attempt of this node's workers: start and supervise them; unless all succeed, stop the rest and
// print the failure summary; stop what they left behind. What comes next (a restart) is the caller's.
#pragma once

#include <poll.h>
#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "command_line/output_spec.h"
#include "command_line/uninterruptible_state_settings.h"
#include "diagnosis/hang_diagnosis.h"
#include "diagnosis/node_evidence.h"
#include "workers/signal_relay.h"
#include "workers/worker_process.h"

namespace cpprun::launcher {

// A reaped worker's wait status, decoded.
struct WorkerExit {
  enum class Kind { kExited, kSignaled };
  Kind kind = Kind::kExited;
  int value = 0;  // exit code for kExited, signal number for kSignaled

  static WorkerExit from_wait_status(int status);
  static WorkerExit exited(int code) { return {Kind::kExited, code}; }
  static WorkerExit signaled(int sig) { return {Kind::kSignaled, sig}; }

  bool succeeded() const { return kind == Kind::kExited && value == 0; }
  // cpprun's exit code when this worker is the root cause: its code, or 128+signal as a shell would say.
  int launcher_exit_code() const { return kind == Kind::kSignaled ? 128 + value : value; }
  // "exited with code 3", "killed by SIGKILL (Killed)".
  std::string describe() const;
};

// "SIGTERM" for the signals a launcher meets; "signal 42" for the rest.
std::string signal_name(int sig);

enum class WorkerState {
  kRunning,            // spawned, not yet reaped
  kFinished,           // ended on its own (success or failure)
  kStoppedByLauncher,  // ended after the launcher signalled its process group
  kAbandoned,          // SIGKILLed, not reaped wait_after_sigkill() later: given up on (Note [A worker
                       // SIGKILL cannot end] in attempt.cpp); no exit status
};

struct WorkerRecord {
  int local_rank = 0;
  int rank = 0;
  pid_t pid = -1;  // also the worker's process group (and session) id
  WorkerState state = WorkerState::kRunning;
  std::optional<WorkerExit> exit;  // set once reaped
  bool sent_sigkill = false;       // still alive at the end of the grace period
  bool group_lingers = false;      // reaped, its group not empty: Note [Orphans in a worker's process group]
};

struct WorkerSpec {
  int local_rank = 0;
  int rank = 0;
  WorkerCommand command;
  WorkerOutputSpec output;
  std::string error_file;  // TORCHELASTIC_ERROR_FILE, also in command.env
  std::string flight_recorder_dir;  // CPPRUN_FLIGHT_RECORDER_DIR, also in command.env
  // Where PyTorch's NCCL flight recorder dumps (workers/nccl_trace_env.h); "" if the user chose the place.
  // run_attempt creates it, and removes it again if it stays empty.
  std::string nccl_trace_dir;
};

enum class GroupEnd {
  kSucceeded,     // every worker exited 0
  kWorkerFailed,  // a worker exited non-zero or died by a signal
  kInterrupted,   // cpprun received a job-ending signal (see ends_job) and forwarded it
  kPeerEnded,     // another node, or the store keeper's end, ended the attempt (see PeerEvents)
  kUnhealthy,     // a worker stayed in uninterruptible sleep (D state) past
                  // TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT: no restart, as torchrun
};

// Events from the other nodes' agents that can end an attempt, polled with the workers' pipes.
class PeerEvents {
 public:
  virtual ~PeerEvents() = default;
  // What to poll: each link for reading, and for writing while its queue holds bytes (Note [The
  // link's outbound queue] in node_link.h); never a closed one.
  virtual std::vector<pollfd> poll_fds() const = 0;
  // `fd`, one of poll_fds(), after a poll(): ready (`revents` as poll() set them), or polled for
  // writing and not ready (0), so that a queue that stopped draining is noticed.
  virtual void on_ready(int fd, short revents) = 0;
  // While a link's queue waits, a poll() over poll_fds() wakes at least this often.
  static constexpr int kWriteCheckMs = 1000;
  // `timeout_ms` (-1: none) for a poll() over `fds`, no longer than kWriteCheckMs while one is polled for writing.
  static int poll_timeout(const std::vector<pollfd>& fds, int timeout_ms);
  // After that poll(): on_ready() for each of fds[first..] that is ready, or polled for writing.
  void dispatch(const std::vector<pollfd>& fds, std::size_t first);
  // Another node ended the attempt: its worker failed, its agent was signalled, or it is gone; or
  // this node's store keeper ended (store_keeper.h).
  virtual bool attempt_ended() const = 0;
  // Why, once attempt_ended(): what the diagnosis says ended the attempt.
  virtual std::string end_reason() const { return "another node ended the attempt"; }

  // `cpprun --diagnose` while the workers run (Note [Diagnosis on request across nodes] in
  // node_rendezvous.h). The defaults are a node alone: nobody else to ask, nothing asked of it.
  //
  // Asked here, on the host: asks every other node of the round for its ranks' evidence and returns
  // the request's number (from 1); 0 when no other node is asked (a member, or no other node runs).
  virtual int ask_nodes_for_evidence() { return 0; }
  // Whether a node still owes request `request` its answer (neither done, gone nor heard in full).
  virtual bool evidence_owed(int /*request*/) { return false; }
  // Closes request `request`: this node's ranks (`own`) and what the others sent, one per rank of the
  // job, naming the ranks heard nothing of within `waited`. A later answer to it is set aside.
  virtual MergedEvidence close_evidence_request(int /*request*/, std::vector<RankEvidence> own,
                                                std::chrono::milliseconds /*waited*/) {
    return {std::move(own), {}};
  }
  // Asked here, on a member: a line saying that this is one node's part and where to ask for the
  // whole job; "" on the host or alone.
  virtual std::string partial_answer_note() const { return ""; }
  // A member: the host's request not answered yet (0: none), taken once; then the answer goes back.
  virtual int take_evidence_request() { return 0; }
  virtual void answer_evidence_request(int /*request*/, const std::vector<RankEvidence>& /*evidence*/) {}
};

struct AttemptEnd {
  GroupEnd end = GroupEnd::kSucceeded;
  int exit_code = 0;        // what cpprun exits with for it: the root cause's code, or 128+signal
  int signal = 0;           // kInterrupted: the job-ending signal cpprun received (maybe while stopping)
  std::string root_worker;  // kWorkerFailed, kUnhealthy: "rank 1 (local_rank 1, pid 4242)"
  std::string root_how;     // kWorkerFailed: "exited with code 3"; kUnhealthy: "stuck in uninterruptible sleep ..."
  std::string root_error_file;  // kWorkerFailed: the root cause's TORCHELASTIC_ERROR_FILE
  int root_error_code = 0;      // kWorkerFailed: torch's exit code for it (-SIGNAL if killed)
};

// Multi-node: where the attempt's flight-recorder evidence goes instead of this console alone (Note
// [One diagnosis for several nodes] in node_rendezvous.h).
struct EvidenceRoute {
  // Once the dumps are gathered, before the workers are stopped: a member sends them to node 0.
  std::function<void(const std::vector<RankEvidence>& evidence)> share;
  // After the failure summary, in place of printing this node's diagnosis.
  std::function<void(const std::vector<RankEvidence>& evidence, const std::string& why,
                     const std::string& diagnosis_file)>
      report;
};

// Note [An unhealthy attempt]
// With TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT set, the workers' states are read every
// --monitor_interval (uninterruptible_watch.h); one that stays in D that long ends the attempt as
// kUnhealthy: the workers are stopped as after a failure and, as torchrun 2.15 sets its remaining
// restarts to 0, there is no restart (a worker wedged in a driver holds the GPU or NIC a new one
// would need). torchrun then exits 0 (launch_agent tests RunResult.is_failed(), which is FAILED
// only, and the run's state is UNHEALTHY); cpprun exits 1, as torchrun does for a failed worker: a
// scheduler must not read a wedged job as a finished one.
//
// `peers` (multi-node) may end the attempt too; `before_stop`, if set, runs once the attempt has
// ended badly, before the workers are stopped, so other nodes hear of it at once. Then the workers
// that record collectives are asked for their flight-recorder dumps, and the diagnosis made of them
// is printed after the failure summary and written to `diagnosis_file` (if not ""), or goes `route`'s way.
// `peers` are read meanwhile too, so that another node's evidence is not held up.
AttemptEnd run_attempt(SignalRelay& relay, const std::vector<WorkerSpec>& specs,
                       std::chrono::milliseconds shutdown_timeout, const UninterruptibleStateSettings& uninterruptible,
                       PeerEvents* peers, const std::function<void(const AttemptEnd&)>& before_stop,
                       const std::string& diagnosis_file = "", const EvidenceRoute* route = nullptr);

// What the failure summary says besides the workers' records.
struct AttemptSummary {
  std::optional<std::size_t> root_cause;  // index into the workers, when a worker failed
  int ending_signal = 0;                  // the signal cpprun received, when interrupted
  std::chrono::milliseconds shutdown_timeout{0};
  // Of the root cause: its last stderr lines, and its TORCHELASTIC_ERROR_FILE if it wrote one.
  std::vector<std::string> root_cause_stderr_tail;
  std::optional<std::string> root_cause_error_file;
  std::string unhealthy;  // kUnhealthy: "rank 0 (...) stuck in uninterruptible sleep (D state) for ..."
  int stop_signal = SIGTERM;  // what the workers were sent first: SIGTERM, or the job-ending signal forwarded
  std::chrono::milliseconds kill_wait{0};  // how long the wait after SIGKILL was (kill_wait.h)
  // A multi-node job: the root cause is this node's first failure, "failed first on this node"; the
  // job's is the first failure node 0 heard of, named when cpprun exits (Note [A job's root cause]).
  bool one_of_several_nodes = false;
};

// One line per worker, then the root cause's stderr tail and error file; every line "cpprun: ...\n". Pure.
std::string format_attempt_summary(const std::vector<WorkerRecord>& workers, const AttemptSummary& summary);

}  // namespace cpprun::launcher
