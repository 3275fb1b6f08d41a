// Unit tests of the signal relay's life cycle: what it leaves behind for `cpprun --diagnose`'s
// signal, in cpprun and in the workers it starts.
#include "catch.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "workers/signal_relay.h"

using namespace cpprun::launcher;

namespace {

// The disposition of `sig` in this process: SIG_DFL, SIG_IGN or a handler.
void (*handler_of(int sig))(int) {
  struct sigaction now {};
  sigaction(sig, nullptr, &now);
  return now.sa_handler;
}

}  // namespace

TEST_CASE("signal_relay: after the relay, a diagnose request is ignored, never the end of cpprun", "[signal_relay]") {
  const int diagnose = diagnose_signal();
  { SignalRelay relay; }
  // A request arriving during cpprun's last wait (~JobProcessTree) or its exit: was SIG_DFL (a
  // real-time signal's default ends the process), and cpprun ended by SIGRTMIN+2 rather than with
  // its workers' exit code.
  CHECK(handler_of(diagnose) == SIG_IGN);
  CHECK(raise(diagnose) == 0);  // survives it

  // A later relay's workers still start with the process's startup disposition (ctest starts this
  // binary with the default), not the ignore.
  SignalRelay again;
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    again.restore_in_child();
    _exit(handler_of(diagnose) == SIG_DFL ? 0 : 1);
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}
