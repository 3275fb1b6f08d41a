// How a worker ended and what the launcher knows about it: the vocabulary of supervision and reports.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>

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
  // What the launcher exits with when this worker is the root cause: the worker's own code, or
  // 128+signal like a shell, so `cpprun ... ; echo $?` reads the same as running the worker alone.
  int launcher_exit_code() const;
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
  // The worker has been reaped but processes it started still run in its process group.
  // See Note [Orphans in a worker's process group] in worker_group.h.
  bool group_lingers = false;
};

}  // namespace cpprun::launcher
