// Turns the signals the launcher handles into bytes on a pipe, so supervision can wait on a file
// descriptor (with poll) instead of doing work inside signal handlers or sleeping in a loop.
#pragma once

#include <csignal>
#include <functional>
#include <vector>

namespace cpprun::launcher {

// Signals cpprun forwards to every worker's process group (as torchrun does).
inline constexpr int kForwardedSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};

// Job-control signals, handled by the relay itself: see Note [Job control].
inline constexpr int kJobControlSignals[] = {SIGTSTP, SIGCONT};

// Forwarded signals that also end the job: the group is stopped and cpprun exits 128+signal,
// without restarting. SIGUSR1/SIGUSR2 are only passed on (e.g. "checkpoint now").
bool ends_job(int sig);

// One per process: owns the handlers for kForwardedSignals, kJobControlSignals and SIGCHLD.
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
  // number, SIGCHLD included. Drains wake_fd(). SIGTSTP and SIGCONT are acted on here and not
  // returned: see Note [Job control].
  std::vector<int> take_pending();

  // Note [Job control]
  // Workers lead sessions of their own (Note [Worker sessions]), so the terminal's Ctrl-Z (SIGTSTP
  // to its foreground process group) reaches cpprun alone. cpprun passes it on as SIGSTOP: a
  // worker's process group is orphaned (its parent, cpprun, is in another session), and the kernel
  // discards SIGTSTP sent to an orphaned group. Then cpprun stops itself with SIGTSTP, so the shell
  // sees an ordinary stopped job; `fg`/`bg` send it SIGCONT, which it passes on to the workers (as
  // any SIGCONT it gets). Whichever loop drains the relay does this, so Ctrl-Z also stops cpprun
  // while it waits for other nodes or before a restart. If cpprun's own group is orphaned, the
  // kernel discards its SIGTSTP too, and the workers are continued at once: nothing stops.
  // `signal_workers` (nullptr: none run) is called with SIGSTOP and SIGCONT.
  void set_job_control(std::function<void(int sig)> signal_workers);

  // In a forked child, before exec: puts back the dispositions and signal mask cpprun started with,
  // so workers see the signals as if cpprun were not there. Async-signal-safe.
  void restore_in_child() const noexcept;

 private:
  // SIGTSTP: stops the workers, then cpprun, and continues the workers once cpprun is continued.
  void stop_job();

  std::function<void(int)> signal_workers_;
};

}  // namespace cpprun::launcher
