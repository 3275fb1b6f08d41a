// Turns the signals the launcher handles into bytes on a pipe, so supervision can wait on a file
// descriptor (with poll) instead of doing work inside signal handlers or sleeping in a loop.
#pragma once

#include <csignal>
#include <vector>

namespace cpprun::launcher {

// Signals cpprun forwards to every worker's process group (as torchrun does).
inline constexpr int kForwardedSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};

// Forwarded signals that also end the job: the group is stopped and cpprun exits 128+signal,
// without restarting. SIGUSR1/SIGUSR2 are only passed on (e.g. "checkpoint now").
bool ends_job(int sig);

// One per process: owns the handlers for kForwardedSignals and SIGCHLD.
// Note [Signals ignored at startup]: a forwarded signal that was SIG_IGN when cpprun started (nohup
// sets SIGHUP so, a non-interactive shell's `&` sets SIGINT and SIGQUIT) stays ignored, so that
// `nohup cpprun ...` survives a hangup the way the user asked. SIGCHLD is always caught: the
// launcher cannot reap workers if the kernel auto-reaps them.
class SignalRelay {
 public:
  SignalRelay();
  ~SignalRelay();  // restores the startup dispositions
  SignalRelay(const SignalRelay&) = delete;
  SignalRelay& operator=(const SignalRelay&) = delete;

  // Readable when signals are pending; wait on it with poll().
  int wake_fd() const;

  // The signals received since the last call (each once, however often it arrived), in ascending
  // number, SIGCHLD included. Drains wake_fd().
  std::vector<int> take_pending();

  // In a forked child, before exec: puts back the dispositions and signal mask cpprun started with,
  // so workers see the signals as if cpprun were not there. Async-signal-safe.
  void restore_in_child() const noexcept;
};

}  // namespace cpprun::launcher
