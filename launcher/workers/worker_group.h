// Supervising one attempt's workers: start them, wait for the exit (or signal) that decides the
// attempt, stop the rest; and how a worker ended. Knows nothing of restarts.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "workers/signal_relay.h"
#include "workers/worker_output.h"
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
  // What cpprun exits with when this worker is the root cause: its code, or 128+signal like a
  // shell, so `cpprun ... ; echo $?` reads the same as running the worker alone.
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
};

enum class GroupEnd {
  kSucceeded,     // every worker exited 0
  kWorkerFailed,  // a worker exited non-zero or died by a signal
  kInterrupted,   // cpprun received a job-ending signal (see ends_job) and forwarded it
  kPeerEnded,     // another node ended the attempt (multi-node jobs; see PeerEvents)
};

// Events from the other nodes' agents that can end an attempt, polled in WorkerGroup::wait()'s loop.
class PeerEvents {
 public:
  virtual ~PeerEvents() = default;
  virtual std::vector<int> fds() const = 0;  // to poll for reading; never a closed one
  virtual void on_readable(int fd) = 0;      // `fd`, one of fds(), is readable (or at its end)
  // Another node ended the attempt: its worker failed, its agent was signalled, or it is gone.
  virtual bool attempt_ended() const = 0;
};

struct GroupOutcome {
  GroupEnd end = GroupEnd::kSucceeded;
  std::optional<std::size_t> root_cause;  // index in workers() of the first failure, if any
  int signal = 0;                         // the job-ending signal, for kInterrupted
};

enum class StopStart {
  kSendSigterm,       // a worker failed: ask the others to finish
  kAlreadySignalled,  // wait() forwarded a job-ending signal; sending more would cut short the
                      // workers' own clean-up (a second SIGINT interrupts Python's `finally`)
};

// Note [Orphans in a worker's process group]
// A worker's group outlives it while its children run on (`./helper & exit 1`). Probed at reap
// time (kill(-pgid, 0)), such a group gets the signals forwarded and is SIGKILLed once the other
// workers are gone. Only failed and stopped workers are probed: their groups are signalled moments
// later, while the orphans still pin the id, so it cannot name another group. Other leftovers are
// stopped when the attempt ends (Note [The job's process tree]; torchrun leaves them running).
class WorkerGroup {
 public:
  explicit WorkerGroup(SignalRelay& relay);
  // Never leaves a worker behind, even when unwinding from an exception: SIGKILLs and reaps.
  ~WorkerGroup();
  WorkerGroup(const WorkerGroup&) = delete;
  WorkerGroup& operator=(const WorkerGroup&) = delete;

  // Creates every worker's pipes and log files (std::system_error), then starts the workers in
  // order. If one cannot start, those already running are stopped and the SpawnError is rethrown.
  void start(const std::vector<WorkerSpec>& specs, std::chrono::milliseconds grace);

  // Blocks until every worker succeeded, one failed, a job-ending signal arrived, or `peers` (if
  // any) say another node ended the attempt, forwarding signals to the workers' groups meanwhile.
  GroupOutcome wait(PeerEvents* peers = nullptr);

  // Signals the running workers' groups (per `how`), waits up to `grace`, then SIGKILLs the groups
  // still running or lingering and reaps them. Signals arriving meanwhile are still forwarded.
  void stop(StopStart how, std::chrono::milliseconds grace);

  // The first job-ending signal cpprun received in wait() or stop(); 0 if none. A signal during a
  // failure's stop still means "do not restart".
  int ending_signal() const { return ending_signal_; }

  const std::vector<WorkerRecord>& workers() const { return workers_; }
  std::vector<std::string> stderr_tail(std::size_t i) const { return outputs_.at(i)->err.tail().lines(); }

 private:
  void handle_events(WorkerState exit_state);  // forwards pending signals, then reaps
  void reap(WorkerState exit_state);
  // Worker i was reaped in wait() or stop(): records it, and whether it is the root cause.
  void on_exit(std::size_t i, int status, WorkerState exit_state);
  // Sleeps in poll() until a signal (SIGCHLD included), `peers` or the timeout wakes it, copying
  // whatever output arrives meanwhile.
  void wait_for_signal(int timeout_ms, PeerEvents* peers = nullptr);
  // Records how worker i ended and copies out everything it wrote (Note [Worker output pipes]).
  void record_exit(std::size_t i, int status, WorkerState state);
  void kill_remaining();
  void signal_groups(int sig);
  std::size_t running() const;

  SignalRelay& relay_;
  std::vector<WorkerRecord> workers_;
  std::vector<std::unique_ptr<WorkerOutput>> outputs_;  // parallel to workers_
  std::optional<std::size_t> root_cause_;
  int ending_signal_ = 0;
};

}  // namespace cpprun::launcher
