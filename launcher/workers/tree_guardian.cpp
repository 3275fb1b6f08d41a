// The guardian: blocks reading a socket whose only other end is cpprun's. A byte means
// "dismissed"; EOF means cpprun died without saying so, and the guardian sweeps.
#include "workers/tree_guardian.h"

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <ctime>
#include <system_error>

#include "workers/process_table.h"

namespace cpprun::launcher {
namespace {

// SIGKILL every process carrying the token until none is left: a killed process's children may
// still have been forking. Bounded, in case something forks faster than we can kill.
void sweep(const std::string& token_entry) {
  const pid_t self = getpid();
  for (int round = 0; round < 500; ++round) {
    bool any = false;
    for (pid_t pid : processes_with_env_entry(token_entry)) {
      if (pid == self) continue;
      any = true;
      kill(pid, SIGKILL);
    }
    if (!any) return;
    const timespec pause{0, 10 * 1000 * 1000};  // let the kernel tear them down before looking again
    nanosleep(&pause, nullptr);
  }
}

[[noreturn]] void run_guardian(int line, const std::string& token_entry) {
  // Its own session: Ctrl-C, Ctrl-Z or a hangup meant for cpprun's process group must not take away
  // the guardian, nor a kill of that whole group; only cpprun's end (or SIGKILL) ends it.
  setsid();
  prctl(PR_SET_NAME, "cpprun-guardian");  // what ps shows
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGTSTP, SIGTTIN, SIGTTOU, SIGPIPE, SIGUSR1, SIGUSR2}) {
    signal(sig, SIG_IGN);
  }
  // Nobody reads what it could print; keep stderr for nothing but a crash's message.
  const int null = open("/dev/null", O_RDWR);
  if (null >= 0) {
    dup2(null, STDIN_FILENO);
    dup2(null, STDOUT_FILENO);
    if (null > STDERR_FILENO) close(null);
  }
  char byte = 0;
  ssize_t got = 0;
  do {
    got = read(line, &byte, 1);
  } while (got < 0 && errno == EINTR);
  if (got == 0) sweep(token_entry);
  _exit(0);
}

}  // namespace

TreeGuardian::TreeGuardian(const std::string& token_entry) {
  int fds[2];
  // Close-on-exec: a worker holding cpprun's end would keep the guardian from ever seeing EOF. A
  // socket rather than a pipe so that dismissing a guardian that died cannot raise SIGPIPE.
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
    throw std::system_error(errno, std::generic_category(), "cpprun: creating the guardian's socket");
  }
  // Forked twice, the guardian is not cpprun's child but init's (or an outer subreaper's), so that
  // every child of cpprun is a worker or something the workers left (see stop_leftovers).
  const pid_t middle = fork();
  if (middle < 0) {
    const int error = errno;
    close(fds[0]);
    close(fds[1]);
    throw std::system_error(error, std::generic_category(), "cpprun: forking the guardian process");
  }
  if (middle == 0) {
    close(fds[1]);
    if (fork() == 0) run_guardian(fds[0], token_entry);
    _exit(0);  // if that fork failed, cpprun runs unguarded: nothing else it does depends on it
  }
  close(fds[0]);
  line_ = fds[1];
  int status = 0;
  while (waitpid(middle, &status, 0) < 0 && errno == EINTR) {
  }
}

TreeGuardian::~TreeGuardian() {
  const char dismissed = 'q';
  if (send(line_, &dismissed, 1, MSG_NOSIGNAL) == 1) {
    // The guardian's end closes when it exits: wait for that, so that it never outlives cpprun.
    char byte = 0;
    while (recv(line_, &byte, 1, 0) < 0 && errno == EINTR) {
    }
  }
  close(line_);
}

}  // namespace cpprun::launcher
