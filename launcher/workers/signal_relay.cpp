// Self-pipe signal relay: the handler only sets a flag and writes a byte.
#include "workers/signal_relay.h"

#include "workers/console_sink.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>

namespace cpprun::launcher {
namespace {

constexpr int kHandledSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGTSTP, SIGCONT, SIGCHLD};

// Note [Signals ignored at startup]
// torchrun installs its handlers whatever it inherited, so a job a script started with `&` (which
// a non-interactive shell starts with SIGINT and SIGQUIT ignored) stops at the script's `kill
// -INT`, and its workers start with these signals at their defaults: cpprun does the same for
// SIGINT, SIGTERM and SIGQUIT. SIGHUP ignored at startup stays ignored, by cpprun and its workers:
// that is `nohup cpprun ...`, asking the job to outlive the terminal (torchrun's handler ends a
// nohup'd job at the hangup). SIGUSR1/2 ignored stay ignored, as torchrun (which does not handle
// them by default) leaves them; listed in --signals_to_handle they are torchrun's too, handled
// whatever it inherited, and at their defaults in the workers (exec resets a caught signal).
//
// Note [SIGUSR1 and SIGUSR2]
// torchrun's agent turns each signal --signals_to_handle lists into a SignalException
// (multiprocessing/api.py: _terminate_process_handler), which its run() answers with
// _shutdown(that signal): the signal to every worker, SIGKILL after the shutdown timeout; then the
// exception ends the launcher (launcher/api.py; run.py's @record main writes it to the error file).
// Listed, SIGUSR1 and SIGUSR2 do the same here, exactly as SIGTERM does (exit 128+signal,
// "SignalException: Process PID got signal: 10" in TORCHELASTIC_ERROR_FILE). Not listed (the
// default list is SIGTERM,SIGINT,SIGHUP,SIGQUIT), torchrun leaves them at their default action,
// which kills the agent alone and leaves its workers running without a launcher: nothing a user
// wants copied. cpprun passes them on and keeps the job running, so a worker may checkpoint on
// Slurm's pre-emption warning (`--signal=USR1@90`) and carry on or exit as it chooses.
bool listed_user_signal(int sig);
bool respects_startup_ignore(int sig) {
  return sig == SIGHUP || sig == SIGTSTP || ((sig == SIGUSR1 || sig == SIGUSR2) && !listed_user_signal(sig));
}
bool default_in_workers(int sig) { return sig == SIGINT || sig == SIGTERM || sig == SIGQUIT || listed_user_signal(sig); }

// Handler state must be global: a signal handler gets no context pointer.
static_assert(std::atomic<bool>::is_always_lock_free, "handler flags must be async-signal-safe");
// SIGUSR1 and SIGUSR2 listed in --signals_to_handle (Note [SIGUSR1 and SIGUSR2]); read by handlers.
std::atomic<bool> g_listed[NSIG];
bool listed_user_signal(int sig) { return (sig == SIGUSR1 || sig == SIGUSR2) && g_listed[sig].load(); }
std::atomic<bool> g_pending[NSIG];
int g_wake_read = -1;
int g_wake_write = -1;
struct sigaction g_startup_action[NSIG];
sigset_t g_startup_mask;

// One slot per waiting `cpprun --diagnose`: its pid in the high half, its fd in the low, 0 when free.
// One word, so that the handler's claim and the loop's take cannot see half a request.
static_assert(std::atomic<std::uint64_t>::is_always_lock_free, "diagnose slots must be async-signal-safe");
std::atomic<std::uint64_t> g_diagnose_requests[kDiagnoseQueue];

// The first job-ending signal this process received (0: none), for job_ending_signal_received().
std::atomic<int> g_first_job_ending{0};

// Marks `sig` pending in `pending` (a direct signal's flags, or a relayed one's), notes the first
// job-ending one, and wakes the loop. Async-signal-safe.
void note_signal(int sig, std::atomic<bool>* pending) {
  const int saved_errno = errno;
  pending[sig].store(true);
  if (ends_job(sig)) {
    int none = 0;
    g_first_job_ending.compare_exchange_strong(none, sig);
  }
  // A full pipe already guarantees a wake-up, so a failed write loses nothing.
  const char byte = 0;
  [[maybe_unused]] const ssize_t n = write(g_wake_write, &byte, 1);
  errno = saved_errno;
}

void on_signal(int sig) { note_signal(sig, g_pending); }

// Note [One signal, two routes]
// The guardian passes the signals it gets on to cpprun (Note [The guardian relays the launcher's
// signals], job_process_tree.cpp). `pkill -f "cpprun ..."`, `pkill cpprun`, Slurm's scancel or
// systemd's control-group kill signal both processes: cpprun then got the signal twice, and the
// workers too (a second SIGINT cuts a Python worker's `finally` short), where torchrun's one
// process gets it once. The guardian sends with sigqueue() and kRelayedMarker, so the handler
// tells a relayed copy from a direct one; take_pending() passes on one of each pair: a signal
// that arrives by the other route within kSameSignalWindow of the last one passed on is that
// one's copy. Two signals by the same route (Ctrl-C twice) are both passed on, as before.
std::atomic<bool> g_relayed_pending[NSIG];
constexpr auto kSameSignalWindow = std::chrono::seconds(1);

void on_forwarded_signal(int sig, siginfo_t* info, void*) {
  const bool relayed = info != nullptr && info->si_code == SI_QUEUE && info->si_value.sival_int == kRelayedMarker;
  note_signal(sig, relayed ? g_relayed_pending : g_pending);
}

bool forwarded(int sig) {
  return sig == SIGINT || sig == SIGTERM || sig == SIGHUP || sig == SIGQUIT || sig == SIGUSR1 || sig == SIGUSR2;
}

// take_pending()'s memory of the last signal of each number it passed on: when, and by which route.
struct LastPassedOn {
  std::chrono::steady_clock::time_point when{};
  bool relayed = false;
  bool valid = false;
};
LastPassedOn g_last_passed_on[NSIG];

void on_diagnose_signal(int sig, siginfo_t* info, void*) {
  const bool queued = info != nullptr && info->si_code == SI_QUEUE && info->si_pid > 0 &&
                      info->si_value.sival_int >= 0;
  if (queued) {
    const std::uint64_t request = (static_cast<std::uint64_t>(static_cast<std::uint32_t>(info->si_pid)) << 32) |
                                  static_cast<std::uint32_t>(info->si_value.sival_int);
    for (auto& slot : g_diagnose_requests) {
      std::uint64_t free = 0;
      if (slot.compare_exchange_strong(free, request)) break;
    }
  }
  on_signal(sig);
}

// SIGTSTP: stops the workers, then cpprun, and continues the workers once cpprun is continued.
void stop_job(const std::function<void(int)>& signal_workers) {
  if (signal_workers) signal_workers(SIGSTOP);
  // The default action stops this process right inside raise(); it returns once continued.
  struct sigaction ours {};
  sigaction(SIGTSTP, nullptr, &ours);
  signal(SIGTSTP, SIG_DFL);
  raise(SIGTSTP);
  sigaction(SIGTSTP, &ours, nullptr);
  // SIGCONT's handler has run too, but its flag is read in a later call; continue them now.
  if (signal_workers) signal_workers(SIGCONT);
}

}  // namespace

int diagnose_signal() { return SIGRTMIN + 2; }

std::vector<DiagnoseRequest> take_diagnose_requests() {
  std::vector<DiagnoseRequest> requests;
  for (auto& slot : g_diagnose_requests) {
    if (const std::uint64_t request = slot.exchange(0); request != 0) {
      requests.push_back({static_cast<pid_t>(request >> 32), static_cast<int>(request & 0xffffffffu)});
    }
  }
  return requests;
}

bool ends_job(int sig) {
  return sig == SIGINT || sig == SIGTERM || sig == SIGHUP || sig == SIGQUIT || listed_user_signal(sig);
}

std::vector<int> listed_user_signals(const std::string& signals_to_handle) {
  const auto trimmed = [](const std::string& t) {
    const auto first = t.find_first_not_of(" \t\n\r\f\v");
    return first == std::string::npos ? std::string() : t.substr(first, t.find_last_not_of(" \t\n\r\f\v") - first + 1);
  };
  std::vector<int> listed;
  std::size_t start = 0;
  for (;;) {
    const std::size_t comma = signals_to_handle.find(',', start);
    std::string name = trimmed(signals_to_handle.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (name.size() >= 2 && (name.front() == '\'' || name.front() == '"') && name.back() == name.front()) {
      name = trimmed(name.substr(1, name.size() - 2));
    }
    const int sig = name == "SIGUSR1" ? SIGUSR1 : name == "SIGUSR2" ? SIGUSR2 : 0;
    if (sig != 0 && std::find(listed.begin(), listed.end(), sig) == listed.end()) listed.push_back(sig);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  std::sort(listed.begin(), listed.end());
  return listed;
}

SignalRelay::SignalRelay(const std::vector<int>& listed) {
  if (g_wake_read >= 0) throw std::logic_error("SignalRelay: only one instance per process");
  for (int sig : listed) {
    if (sig != SIGUSR1 && sig != SIGUSR2) throw std::logic_error("SignalRelay: only SIGUSR1 and SIGUSR2 are listed");
    g_listed[sig].store(true);
  }
  int fds[2];
  if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) {
    throw std::system_error(errno, std::generic_category(), "cpprun: creating the signal pipe");
  }
  g_wake_read = fds[0];
  g_wake_write = fds[1];
  sigprocmask(SIG_SETMASK, nullptr, &g_startup_mask);
  for (int sig : kHandledSignals) {
    sigaction(sig, nullptr, &g_startup_action[sig]);
    if (respects_startup_ignore(sig) && g_startup_action[sig].sa_handler == SIG_IGN) continue;  // Note [Signals ignored at startup]
    struct sigaction action {};
    if (forwarded(sig)) {
      action.sa_sigaction = on_forwarded_signal;  // See Note [One signal, two routes]
    } else {
      action.sa_handler = on_signal;
    }
    sigemptyset(&action.sa_mask);
    // SA_RESTART: only poll() should see EINTR. SA_NOCLDSTOP: a stopped worker is not an exit.
    action.sa_flags = SA_RESTART | (sig == SIGCHLD ? SA_NOCLDSTOP : 0) | (forwarded(sig) ? SA_SIGINFO : 0);
    sigaction(sig, &action, nullptr);
  }
  const int diagnose = diagnose_signal();
  // Once per process: a relay made after another finds the diagnose signal ignored by the
  // destructor, which is not what cpprun's workers inherit (restore_in_child).
  static bool startup_saved = false;
  if (!std::exchange(startup_saved, true)) sigaction(diagnose, nullptr, &g_startup_action[diagnose]);
  struct sigaction action {};
  action.sa_sigaction = on_diagnose_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART | SA_SIGINFO;
  sigaction(diagnose, &action, nullptr);
}

SignalRelay::~SignalRelay() {
  for (int sig : kHandledSignals) sigaction(sig, &g_startup_action[sig], nullptr);
  // Not the startup action: a real-time signal's default ends the process, and a `cpprun --diagnose`
  // sent from now on (a last wait in ~JobProcessTree, the exit) would end cpprun by SIGRTMIN+2
  // instead of the workers' exit code. Ignored, the request goes unanswered: its sender times out.
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  sigaction(diagnose_signal(), &ignore, nullptr);
  close(g_wake_read);
  close(g_wake_write);
  g_wake_read = g_wake_write = -1;
  for (auto& listed : g_listed) listed.store(false);
}

int SignalRelay::wake_fd() const { return g_wake_read; }

bool SignalRelay::wait_until(std::chrono::steady_clock::time_point deadline) const {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
  if (left.count() <= 0) return false;
  std::vector<pollfd> fds{{g_wake_read, POLLIN, 0}};
  ConsoleWait consoles;  // the launcher's own lines behind a backlog: Note [The launcher's own lines]
  consoles.add(fds);
  if (poll(fds.data(), fds.size(), static_cast<int>(std::min<long long>(left.count(), 1 << 30))) < 0) {
    if (errno != EINTR) throw std::runtime_error(std::string("cpprun: poll() failed: ") + std::strerror(errno));
    return true;
  }
  consoles.after(fds);
  return true;
}

std::vector<int> SignalRelay::take_pending() {
  // Drain first, then read the flags: a signal landing in between leaves a byte behind and costs
  // one spurious wake-up, never a lost signal.
  char buffer[256];
  while (read(g_wake_read, buffer, sizeof(buffer)) > 0) {
  }
  std::vector<int> pending;
  const auto now = std::chrono::steady_clock::now();
  for (int sig = 1; sig < NSIG; ++sig) {
    const bool direct = g_pending[sig].exchange(false);
    const bool relayed = g_relayed_pending[sig].exchange(false);
    if (!direct && !relayed) continue;
    if (forwarded(sig)) {  // Note [One signal, two routes]
      LastPassedOn& last = g_last_passed_on[sig];
      const bool by_one_route = direct != relayed;
      const bool other_route_lately = last.valid && last.relayed != relayed && now - last.when < kSameSignalWindow;
      if (by_one_route && other_route_lately) {
        last.valid = false;  // the copy of the one passed on; a third is a signal of its own
        continue;
      }
      // By both routes at once: the pair is complete, no copy is still to come.
      last = {now, relayed, by_one_route};
    }
    if (sig == SIGTSTP) {
      stop_job(signal_workers_);
    } else if (sig == SIGCONT) {
      if (signal_workers_) signal_workers_(SIGCONT);
    } else {
      pending.push_back(sig);
    }
  }
  return pending;
}

void SignalRelay::restore_in_child() const noexcept {
  struct sigaction at_default {};
  at_default.sa_handler = SIG_DFL;
  sigemptyset(&at_default.sa_mask);
  for (int sig : kHandledSignals) {
    sigaction(sig, default_in_workers(sig) ? &at_default : &g_startup_action[sig], nullptr);
  }
  sigaction(diagnose_signal(), &g_startup_action[diagnose_signal()], nullptr);
  // As Python's subprocess (torchrun's workers) does: a program expects a write to a closed pipe
  // to end it, and a file-size limit to stop it, whatever its launcher's parent ignored.
  sigaction(SIGPIPE, &at_default, nullptr);
  sigaction(SIGXFSZ, &at_default, nullptr);
  sigprocmask(SIG_SETMASK, &g_startup_mask, nullptr);
}

int sleep_until(SignalRelay& relay, std::chrono::steady_clock::time_point deadline,
                const std::function<void()>& on_diagnose) {
  while (relay.wait_until(deadline)) {
    for (int sig : relay.take_pending()) {
      if (ends_job(sig)) return sig;
      if (sig == diagnose_signal() && on_diagnose) on_diagnose();
    }
  }
  return 0;
}

int job_ending_signal_received() { return g_first_job_ending.load(); }

}  // namespace cpprun::launcher
