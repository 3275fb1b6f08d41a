// Starting one worker process and signalling it. Everything the child needs is prepared before
// fork(), because between fork() and exec() the child may only make async-signal-safe calls.
#pragma once

#include <sys/types.h>

#include <cerrno>
#include <stdexcept>
#include <string>
#include <vector>

#include "workers/signal_relay.h"

namespace cpprun::launcher {

struct WorkerCommand {
  std::string path;               // already resolved (see resolve_program)
  std::vector<std::string> argv;  // argv[0]: PROGRAM as typed, or the Python interpreter
  std::vector<std::string> env;   // NAME=value
};

// The child's fd 1 and 2 (and 0, `in`), dup2()ed in the child; -1 inherits the launcher's. `extra`, if
// not -1, becomes the child's fd `extra_target` (> 2), inherited across exec (a worker's flight-recorder
// channel, the store keeper's listening socket).
struct ChildStdio {
  int out = -1;
  int err = -1;
  int extra = -1;
  int extra_target = -1;
  int in = -1;
};

class SpawnError : public std::runtime_error {
 public:
  SpawnError(const std::string& message, int error) : std::runtime_error(message), error_(error) {}
  // The shell's convention: 127 when the file vanished, 126 when it cannot be executed, else 1.
  int exit_code() const;

 private:
  int error_;  // errno of the failing call
};

// Forks and execs `command`; returns once the exec succeeded, else throws SpawnError (the child reaped).
// Note [Worker sessions]: the worker leads a new session (its pid is its process group id), as torchrun's
// start_new_session=True: in the terminal's session a worker reading stdin (pdb in rank 0) gets SIGTTIN.
pid_t spawn_worker(const WorkerCommand& command, const ChildStdio& stdio, const SignalRelay& relay);

// kill(-pgid, sig). A group that is already gone is fine; other failures are warned about on stderr.
void signal_process_group(pid_t pgid, int sig);

// Calls `call` again while a signal interrupts it: cpprun's handlers run during every wait.
template <typename Call>
auto retry_on_eintr(const Call& call) {
  auto result = call();
  while (result < 0 && errno == EINTR) result = call();
  return result;
}

// One fcntl(FD_CLOEXEC) for each descriptor from `first` on that /proc/self/fd lists, read with raw
// getdents64 (opendir would allocate): what a worker's child does before exec where close_range()
// is missing (Note [Descriptors a worker inherits]). False, doing nothing, without /proc.
// Async-signal-safe.
bool mark_listed_descriptors_cloexec(int first) noexcept;

// waitpid(), retried.
pid_t wait_for_exit(pid_t pid, int* status = nullptr, int flags = 0);

}  // namespace cpprun::launcher
