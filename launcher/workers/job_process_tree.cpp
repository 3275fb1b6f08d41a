// The subreaper, the job token and its guardian, and finding (in /proc) and stopping what the
// workers left behind.
#include "workers/job_process_tree.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <system_error>

#include "common/formatting.h"
#include "common/job_secret.h"
#include "workers/flight_requests.h"
#include "workers/kill_wait.h"
#include "workers/signal_relay.h"
#include "workers/worker_process.h"

namespace cpprun::launcher {

// Plain open/read: libstdc++'s filebuf throws from underflow() when read() fails, and a read of
// /proc/PID/... fails with ESRCH when PID exits between the open and the read.
std::string read_proc_file(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {};
  std::string text;
  char chunk[4096];
  ssize_t got = 0;
  while ((got = retry_on_eintr([&] { return read(fd, chunk, sizeof chunk); })) > 0) {
    text.append(chunk, static_cast<std::size_t>(got));
  }
  close(fd);
  return got < 0 ? std::string() : text;
}

namespace {

// Every process's id: the numeric names in /proc.
std::vector<pid_t> all_pids() {
  std::vector<pid_t> ids;
  DIR* d = opendir("/proc");
  if (d == nullptr) return ids;
  while (const dirent* entry = readdir(d)) {
    char* end = nullptr;
    const long id = std::strtol(entry->d_name, &end, 10);
    if (end != entry->d_name && *end == '\0' && id > 0) ids.push_back(static_cast<pid_t>(id));
  }
  closedir(d);
  return ids;
}

struct StatFields {
  char state = 'X';  // unreadable: gone, as good as dead
  long ppid = 0;
  bool live() const { return state != 'Z' && state != 'X'; }
};

// "PID (COMM) S PPID ...": COMM may hold spaces and parentheses, so read after the last ')'.
StatFields read_stat(pid_t pid) {
  const std::string stat = read_proc_file("/proc/" + std::to_string(pid) + "/stat");
  const auto close = stat.rfind(')');
  if (close == std::string::npos) return {};
  std::istringstream rest(stat.substr(close + 1));
  StatFields fields;
  return rest >> fields.state >> fields.ppid ? fields : StatFields{};
}

constexpr const char* kJobTokenVariable = "CPPRUN_JOB_TOKEN";

// SIGKILL every process carrying the token until none is left: a killed process's children may
// still have been forking. Bounded, in case something forks faster than we can kill.
void sweep(const std::string& token_entry) {
  const pid_t self = getpid();
  for (int round = 0; round < 500; ++round) {
    std::vector<pid_t> found = processes_with_env_entry(token_entry);
    found.erase(std::remove(found.begin(), found.end(), self), found.end());
    if (found.empty()) return;
    for (pid_t pid : found) kill(pid, SIGKILL);
    const timespec pause{0, 10 * 1000 * 1000};  // let the kernel tear them down before looking again
    nanosleep(&pause, nullptr);
  }
}

// The launcher the guardian relays signals to; 0 once it is gone (its pid may be someone else's).
volatile sig_atomic_t g_launcher = 0;

void relay_to_launcher(int sig) {
  const int saved_errno = errno;
  // Marked, so that cpprun passes on one copy of a signal that reached both of us (Note [One
  // signal, two routes] in signal_relay.cpp). sigqueue is async-signal-safe.
  sigval value{};
  value.sival_int = kRelayedMarker;
  if (g_launcher > 0) sigqueue(static_cast<pid_t>(g_launcher), sig, value);
  errno = saved_errno;
}

// Blocks reading `line` from cpprun: a byte means "dismissed", EOF means cpprun died.
// Note [The guardian relays the launcher's signals]
// The guardian keeps cpprun's command line (it is a fork, not an exec), so `pgrep -nf "cpprun ..."`
// (the newest match) names it, and `kill $(pgrep -nf ...)` reaches it instead of cpprun. torchrun is
// one process with that command line, so such a kill stops its job: the signals cpprun handles
// (those it forwards to the workers) are passed on to cpprun here, which acts on them as if sent to
// it. Its own session still keeps Ctrl-C, Ctrl-Z, a hangup or a kill of cpprun's whole process group
// from reaching it (cpprun gets those itself); only cpprun's end (or SIGKILL) ends it.
[[noreturn]] void run_guardian(int line, const std::string& token_entry, pid_t launcher) {
  setsid();
  prctl(PR_SET_NAME, kGuardianName);  // what ps shows
  g_launcher = launcher;
  for (int sig : {SIGTSTP, SIGTTIN, SIGTTOU, SIGPIPE}) signal(sig, SIG_IGN);
  // `cpprun --diagnose` given this pid (pgrep -f names it with cpprun) asks cpprun instead; a request
  // that reaches it all the same must not end it by the signal's default action, which would leave
  // the job unguarded.
  signal(diagnose_signal(), SIG_IGN);
  struct sigaction relay {};
  relay.sa_handler = relay_to_launcher;
  sigemptyset(&relay.sa_mask);
  relay.sa_flags = SA_RESTART;
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2}) sigaction(sig, &relay, nullptr);
  // Nobody reads what it could print; keep stderr for nothing but a crash's message.
  const int null = open("/dev/null", O_RDWR);
  if (null >= 0) {
    dup2(null, STDIN_FILENO);
    dup2(null, STDOUT_FILENO);
    if (null > STDERR_FILENO) close(null);
  }
  char byte = 0;
  const ssize_t got = retry_on_eintr([&] { return read(line, &byte, 1); });
  g_launcher = 0;  // cpprun is gone or going: nothing more to relay
  if (got == 0) sweep(token_entry);
  _exit(0);
}

// Returns cpprun's end of the guardian's socket. Before any thread starts: the child does not exec.
int start_guardian(const std::string& token_entry) {
  int fds[2];
  // Close-on-exec: a worker holding cpprun's end would keep the guardian from ever seeing EOF. A
  // socket rather than a pipe so that dismissing a guardian that died cannot raise SIGPIPE.
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
    throw std::system_error(errno, std::generic_category(), "cpprun: creating the guardian's socket");
  }
  // Forked twice, the guardian is init's child (or an outer subreaper's), not cpprun's, so that
  // every child of cpprun is a worker or something the workers left.
  const pid_t launcher = getpid();
  const pid_t middle = fork();
  if (middle < 0) {
    const int error = errno;
    close(fds[0]);
    close(fds[1]);
    throw std::system_error(error, std::generic_category(), "cpprun: forking the guardian process");
  }
  if (middle == 0) {
    close(fds[1]);
    if (fork() == 0) run_guardian(fds[0], token_entry, launcher);
    _exit(0);  // if that fork failed, cpprun runs unguarded: nothing else it does depends on it
  }
  close(fds[0]);
  wait_for_exit(middle);
  return fds[1];
}

// Note [The job's helpers]: by pid, each with its wait status once a reaper other than its owner took it.
std::map<pid_t, std::optional<int>>& helpers() {
  static std::map<pid_t, std::optional<int>> known;
  return known;
}

// "1234 (sleep), 1240 (python3) and 3 more"
std::string describe_processes(const std::vector<pid_t>& pids) {
  constexpr std::size_t kNamed = 5;
  std::string text;
  for (std::size_t i = 0; i < pids.size() && i < kNamed; ++i) {
    std::string name = read_proc_file("/proc/" + std::to_string(pids[i]) + "/comm");
    while (!name.empty() && name.back() == '\n') name.pop_back();
    text += (i == 0 ? "" : ", ") + std::to_string(pids[i]) + (name.empty() ? "" : " (" + name + ")");
  }
  if (pids.size() > kNamed) text += " and " + std::to_string(pids.size() - kNamed) + " more";
  return text;
}

// Children SIGKILLed and given up on (Note [A worker SIGKILL cannot end] in attempt.cpp), until reaped.
std::set<pid_t>& abandoned() {
  static std::set<pid_t> pids;
  return pids;
}

// Whether `pid`, a child of ours, was given up on: nobody waits for it again.
bool is_abandoned(pid_t pid) { return abandoned().count(pid) != 0; }

// Reaps every child that has exited; all are leftovers here (no worker runs), helpers, or ones given up on.
void reap_exited() {
  int status = 0;
  for (pid_t got; (got = wait_for_exit(-1, &status, WNOHANG)) > 0;) {
    abandoned().erase(got);
    keep_helper_status(got, status);
  }
}

// cpprun's live children that are not helpers: what the workers left.
std::vector<pid_t> leftover_children() {
  std::vector<pid_t> left = live_children(getpid());
  // A helper whose status another reaper kept has exited: a process of its pid is someone else.
  left.erase(std::remove_if(left.begin(), left.end(),
                            [](pid_t pid) {
                              const auto it = helpers().find(pid);
                              return (it != helpers().end() && !it->second) || is_abandoned(pid);
                            }),
             left.end());
  return left;
}

// The signals that came while stopping leftovers (no worker runs, none to forward them to): the
// first job-ending one is kept in `ending` for the caller (no restart), and `cpprun --diagnose` is
// answered at once, saying what is being stopped (`left`), rather than left to its own timeout.
void take_signals_while_stopping(SignalRelay& relay, const std::vector<pid_t>& left, int& ending) {
  for (int sig : relay.take_pending()) {
    if (ends_job(sig) && ending == 0) ending = sig;
    if (sig == diagnose_signal()) {
      answer_diagnose_without_workers("no worker runs; cpprun is stopping " + std::to_string(left.size()) +
                                      (left.size() == 1 ? " process" : " processes") +
                                      " the workers left behind: " + describe_processes(left));
    }
  }
}

// SIGKILLs `left` until none is left, bounded in rounds in case something forks faster than we kill,
// and in time (wait_after_sigkill(shutdown_timeout) from the first SIGKILL): one the kernel does not
// let go of (Note [A worker SIGKILL cannot end] in attempt.cpp) is named and given up on, what it
// started SIGKILLed. `and_helpers`: the job's end, when nothing may stay. `relay`: signals meanwhile,
// as take_signals_while_stopping() says (null at the job's end, when cpprun no longer handles them);
// returns the first job-ending one, or 0.
int kill_children(std::vector<pid_t> left, bool and_helpers, std::chrono::milliseconds shutdown_timeout,
                  SignalRelay* relay) {
  int ending = 0;
  using Clock = std::chrono::steady_clock;
  const std::chrono::milliseconds wait = wait_after_sigkill(shutdown_timeout);
  const auto deadline = Clock::now() + wait;
  const auto remaining = [&] {
    std::vector<pid_t> now = and_helpers ? live_children(getpid()) : leftover_children();
    now.erase(std::remove_if(now.begin(), now.end(), is_abandoned), now.end());
    return now;
  };
  left.erase(std::remove_if(left.begin(), left.end(), is_abandoned), left.end());
  for (int round = 0; round < 100 && !left.empty(); ++round) {
    for (pid_t pid : left) kill(pid, SIGKILL);
    // Processes found in a later round (forked meanwhile) get a moment even once the wait is over.
    const auto until = std::max(deadline, Clock::now() + std::chrono::milliseconds(100));
    AfterKill next;
    for (;;) {
      reap_exited();
      std::set<pid_t> live;
      for (pid_t pid : left) {
        if (read_stat(pid).live()) live.insert(pid);
      }
      next = decide_after_kill(left, live, until, Clock::now());
      if (!next.keep_waiting) break;
      // Looked at every 10 ms: SIGCHLD does not tell of what is not our child (a leftover's own children).
      const auto pause = std::chrono::milliseconds(10);
      if (relay != nullptr) {
        relay->wait_until(std::min(until, Clock::now() + pause));
        take_signals_while_stopping(*relay, left, ending);
      } else {
        const timespec sleep_for{0, std::chrono::nanoseconds(pause).count()};
        nanosleep(&sleep_for, nullptr);
      }
    }
    if (!next.abandon.empty()) {
      std::size_t descendants = 0;
      for (pid_t pid : next.abandon) descendants += abandon_child(pid);
      std::cerr << "cpprun: error: " << describe_processes(next.abandon) << " did not end within "
                << decimal_seconds(wait) << "s of SIGKILL; giving up on " << (next.abandon.size() == 1 ? "it" : "them")
                << " (uninterruptible sleep, D state? the host may need to be recycled)"
                << (descendants == 0 ? "" : "; SIGKILLed the " + std::to_string(descendants) +
                                                (descendants == 1 ? " process it started" : " processes they started"))
                << "\n";
    }
    left = remaining();
  }
  return ending;
}

}  // namespace

JobProcessTree::JobProcessTree(std::chrono::milliseconds shutdown_timeout) : shutdown_timeout_(shutdown_timeout) {
  // 128 random bits, so no other run's (or stranger's) processes can carry the same token.
  const std::string token = random_nonce();
  // The guardian first: started while cpprun is no subreaper yet, it is not adopted back, and it
  // needs no token of its own.
  guardian_line_ = start_guardian(std::string(kJobTokenVariable) + "=" + token);
  if (setenv(kJobTokenVariable, token.c_str(), 1) != 0) {
    throw std::system_error(errno, std::generic_category(), "cpprun: setting " + std::string(kJobTokenVariable));
  }
  if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) {
    // Kernels before 3.4: orphans go to init, and only the guardian's sweep after a kill of cpprun is left.
    std::cerr << "cpprun: warning: prctl(PR_SET_CHILD_SUBREAPER) failed (" << std::strerror(errno)
              << "): processes the workers leave behind will not be stopped when the job ends\n";
  }
}

JobProcessTree::~JobProcessTree() {
  // Normally nothing is left: each attempt stopped its leftovers, each helper's owner the helper.
  // Whatever is (after an exception, say) gets the wait of any stop, not none: up to
  // wait_after_sigkill(shutdown_timeout_) (30 s or more) after the SIGKILL for what it does not end,
  // then up to 100 rounds (100 ms or more each) for processes found forked meanwhile. The signal
  // relay is gone by now (main() made it later): signals act at cpprun's startup dispositions.
  reap_exited();
  kill_children(live_children(getpid()), true, shutdown_timeout_, nullptr);
  const char dismissed = 'q';
  if (send(guardian_line_, &dismissed, 1, MSG_NOSIGNAL) == 1) {
    // The guardian's end closes when it exits: wait for that, so that it never outlives cpprun.
    char byte = 0;
    retry_on_eintr([&] { return recv(guardian_line_, &byte, 1, 0); });
  }
  close(guardian_line_);
}

void add_job_helper(pid_t pid) { helpers()[pid].reset(); }

bool keep_helper_status(pid_t pid, int status) {
  const auto it = helpers().find(pid);
  if (it == helpers().end()) return false;
  it->second = status;
  return true;
}

std::optional<int> reaped_helper_status(pid_t pid) {
  const auto it = helpers().find(pid);
  return it == helpers().end() ? std::nullopt : it->second;
}

std::optional<int> forget_job_helper(pid_t pid) {
  const auto it = helpers().find(pid);
  if (it == helpers().end()) return std::nullopt;
  const std::optional<int> status = it->second;
  helpers().erase(it);
  return status;
}

int stop_leftovers(SignalRelay& relay, std::chrono::milliseconds grace) {
  reap_exited();
  std::vector<pid_t> left = leftover_children();
  if (left.empty()) return 0;
  std::cerr << "cpprun: stopping " << left.size() << (left.size() == 1 ? " process" : " processes")
            << " the workers left behind: " << describe_processes(left)
            << "; SIGTERM, then SIGKILL after --shutdown_timeout\n";
  int ending = 0;
  std::set<pid_t> told;  // SIGTERM once each, also to orphans of orphans adopted meanwhile
  const auto deadline = std::chrono::steady_clock::now() + grace;
  for (;;) {
    for (pid_t pid : left) {
      if (told.insert(pid).second) kill(pid, SIGTERM);
    }
    // SIGCHLD (through the relay) says one of them exited.
    if (ending != 0 || !relay.wait_until(deadline)) break;
    take_signals_while_stopping(relay, left, ending);
    reap_exited();
    left = leftover_children();
    if (left.empty()) return ending;
  }
  const int while_killing = kill_children(left, false, grace, &relay);
  return ending != 0 ? ending : while_killing;
}

std::size_t abandon_child(pid_t pid) {
  abandoned().insert(pid);
  // What it started in other groups or sessions (or what is not torn down yet), found by parentage:
  // once it ends they would be init's, out of the job's reach.
  const std::vector<pid_t> descendants = live_descendants(pid);
  for (pid_t descendant : descendants) kill(descendant, SIGKILL);
  return descendants.size();
}

void forget_abandoned(pid_t pid) { abandoned().erase(pid); }

std::vector<pid_t> live_descendants(pid_t root) {
  std::map<pid_t, std::vector<pid_t>> children;
  for (pid_t pid : all_pids()) {
    if (const StatFields fields = read_stat(pid); fields.live()) children[static_cast<pid_t>(fields.ppid)].push_back(pid);
  }
  std::vector<pid_t> found;
  for (std::vector<pid_t> next{root}; !next.empty();) {
    const pid_t parent = next.back();
    next.pop_back();
    for (pid_t child : children[parent]) {
      found.push_back(child);
      next.push_back(child);
    }
  }
  return found;
}

std::vector<pid_t> live_children(pid_t parent) {
  std::vector<pid_t> children;
  for (pid_t pid : all_pids()) {
    if (const StatFields fields = read_stat(pid); fields.ppid == parent && fields.live()) children.push_back(pid);
  }
  return children;
}

std::vector<pid_t> processes_with_env_entry(const std::string& entry) {
  std::vector<pid_t> found;
  const std::string needle = std::string(1, '\0') + entry + '\0';
  for (pid_t pid : all_pids()) {
    // A leading NUL lets one search match whole entries only, the first one included.
    const std::string environ = '\0' + read_proc_file("/proc/" + std::to_string(pid) + "/environ");
    if (environ.find(needle) != std::string::npos && read_stat(pid).live()) found.push_back(pid);
  }
  return found;
}

}  // namespace cpprun::launcher
