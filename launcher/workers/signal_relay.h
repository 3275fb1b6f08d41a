// Turns the signals the launcher handles into bytes on a pipe, so supervision waits on a file
// descriptor (with poll) instead of working inside signal handlers or sleeping in a loop.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace cpprun::launcher {

// The value the guardian sends its relayed signals with (sigqueue), so that a signal that reached
// both cpprun and the guardian is passed on to the workers once: Note [One signal, two routes].
inline constexpr int kRelayedMarker = 0x52454c59;  // "RELY"

// Forwarded signals that also end the job: the group is stopped and cpprun exits 128+signal,
// without restarting. SIGUSR1/SIGUSR2 too when --signals_to_handle lists them (the SignalRelay's
// `listed`); else they are only passed on (e.g. "checkpoint now"): Note [SIGUSR1 and SIGUSR2].
bool ends_job(int sig);

// SIGUSR1 and SIGUSR2 as far as --signals_to_handle lists them: comma-separated names, each trimmed
// of whitespace (and one pair of quotes, as cpprun reads every option), matched exactly as
// torchrun's getattr(signal, name). Other names are not for this (see launch_config.cpp). Pure.
std::vector<int> listed_user_signals(const std::string& signals_to_handle);

// One per process: owns the handlers of the signals forwarded to the workers' process groups (as
// torchrun's: SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2), SIGTSTP, SIGCONT and SIGCHLD.
// Note [Signals ignored at startup] (signal_relay.cpp): SIGINT, SIGTERM and SIGQUIT are handled
// whatever cpprun inherited (a non-interactive shell's `&` ignores SIGINT and SIGQUIT), as
// torchrun's; SIGHUP ignored at startup (nohup) stays ignored, by cpprun and its workers.
// SIGCHLD is always caught: the kernel must not auto-reap.
class SignalRelay {
 public:
  // `listed`: SIGUSR1 and SIGUSR2 if --signals_to_handle names them (listed_user_signals()): they
  // then end the job as SIGTERM does, handled even if ignored at startup, at their default in workers.
  explicit SignalRelay(const std::vector<int>& listed = {});
  ~SignalRelay();  // restores the startup dispositions
  SignalRelay(const SignalRelay&) = delete;
  SignalRelay& operator=(const SignalRelay&) = delete;

  int wake_fd() const;  // readable when signals are pending

  // Sleeps in poll() until a signal is pending or `deadline`; false, at once, once it has passed.
  bool wait_until(std::chrono::steady_clock::time_point deadline) const;

  // The signals received since the last call (each once), in ascending number, SIGCHLD included.
  // Drains wake_fd(). SIGTSTP and SIGCONT are acted on here, not returned: Note [Job control].
  std::vector<int> take_pending();

  // Note [Job control]
  // Ctrl-Z's SIGTSTP reaches cpprun alone (workers lead their own sessions). Whichever loop drains the
  // relay sends the workers SIGSTOP through `signal_workers` (nullptr: none run; the kernel discards
  // SIGTSTP sent to their orphaned groups), then stops cpprun so the shell sees a stopped job; the
  // SIGCONT of `fg`/`bg` is passed on. (In an orphaned group cpprun's own SIGTSTP is discarded.)
  void set_job_control(std::function<void(int sig)> signal_workers) { signal_workers_ = std::move(signal_workers); }

  // In a forked child, before exec: puts back the dispositions and signal mask cpprun started with,
  // so workers see signals as if cpprun were not there, except SIGINT, SIGTERM, SIGQUIT, SIGPIPE
  // and SIGXFSZ, at their defaults as under torchrun. Async-signal-safe.
  void restore_in_child() const noexcept;

 private:
  std::function<void(int)> signal_workers_;
};

// `cpprun --diagnose PID`'s request to a running cpprun (SIGRTMIN+2, sent with sigqueue()): caught, never
// forwarded; take_pending() reports it like any signal, and the attempt's loop answers it
// (workers/attempt.cpp). Chosen from the real-time range so that no signal a user or torchrun sends
// changes meaning.
int diagnose_signal();

// Who sent a diagnose_signal() with sigqueue() and which of its fds it asked the answer to be
// written to (a plain kill() leaves none: the console alone answers it).
struct DiagnoseRequest {
  pid_t requester = 0;
  int reply_fd = -1;
};
// The requests received since the last call, each once. Requests that overlap (a second `cpprun
// --diagnose` while the first is being answered) wait here, up to kDiagnoseQueue of them; one past
// that gets no answer in its file (its requester says it had none).
inline constexpr int kDiagnoseQueue = 16;
std::vector<DiagnoseRequest> take_diagnose_requests();

// The first job-ending signal (SIGINT, SIGTERM, SIGHUP, SIGQUIT; SIGUSR1 or SIGUSR2 if listed) a
// SignalRelay of this process caught, or 0: main() records it in the launcher's error file as
// torchrun's SignalException.
int job_ending_signal_received();

// Sleeps until `deadline` while no worker runs. Returns the job-ending signal that cut the wait
// short, or 0; `cpprun --diagnose` is answered by `on_diagnose` (when given), other signals are
// dropped (a diagnose request once was too, and its requester waited out its own timeout).
int sleep_until(SignalRelay& relay, std::chrono::steady_clock::time_point deadline,
                const std::function<void()>& on_diagnose = {});

}  // namespace cpprun::launcher
