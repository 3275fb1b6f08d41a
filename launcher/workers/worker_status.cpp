// Decoding wait statuses and naming signals for the launcher's summaries.
#include "workers/worker_status.h"

#include <sys/wait.h>

#include <csignal>
#include <string.h>  // strsignal is POSIX, not in std::

namespace cpprun::launcher {

WorkerExit WorkerExit::from_wait_status(int status) {
  if (WIFSIGNALED(status)) return signaled(WTERMSIG(status));
  return exited(WEXITSTATUS(status));
}

int WorkerExit::launcher_exit_code() const {
  return kind == Kind::kSignaled ? 128 + value : value;
}

std::string WorkerExit::describe() const {
  if (kind == Kind::kExited) return "exited with code " + std::to_string(value);
  // strsignal gives the human words ("Killed"); the name is what people grep for.
  return "killed by " + signal_name(value) + " (" + ::strsignal(value) + ")";
}

std::string signal_name(int sig) {
  struct Named {
    int number;
    const char* name;
  };
  static constexpr Named kNames[] = {
      {SIGHUP, "SIGHUP"},   {SIGINT, "SIGINT"},     {SIGQUIT, "SIGQUIT"}, {SIGILL, "SIGILL"},
      {SIGTRAP, "SIGTRAP"}, {SIGABRT, "SIGABRT"},   {SIGBUS, "SIGBUS"},   {SIGFPE, "SIGFPE"},
      {SIGKILL, "SIGKILL"}, {SIGUSR1, "SIGUSR1"},   {SIGSEGV, "SIGSEGV"}, {SIGUSR2, "SIGUSR2"},
      {SIGPIPE, "SIGPIPE"}, {SIGALRM, "SIGALRM"},   {SIGTERM, "SIGTERM"}, {SIGCHLD, "SIGCHLD"},
      {SIGCONT, "SIGCONT"}, {SIGSTOP, "SIGSTOP"},   {SIGTSTP, "SIGTSTP"}, {SIGTTIN, "SIGTTIN"},
      {SIGTTOU, "SIGTTOU"}, {SIGXCPU, "SIGXCPU"},   {SIGXFSZ, "SIGXFSZ"}, {SIGSYS, "SIGSYS"},
  };
  for (const Named& n : kNames) {
    if (n.number == sig) return n.name;
  }
  return "signal " + std::to_string(sig);
}

}  // namespace cpprun::launcher
