// Unit tests of exit-status decoding and the exit codes cpprun passes on.
#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <csignal>

#include "workers/attempt.h"

using namespace cpprun::launcher;
using Catch::Matchers::Contains;

namespace {

// A real wait status, so the test does not depend on how the macros encode it.
int wait_status_of(void (*body)()) {
  const pid_t pid = fork();
  if (pid == 0) {
    body();
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return status;
}

}  // namespace

TEST_CASE("worker_status: exit codes pass through, signals become 128+N", "[worker_status]") {
  const WorkerExit three = WorkerExit::from_wait_status(wait_status_of([] { _exit(3); }));
  CHECK(three.kind == WorkerExit::Kind::kExited);
  CHECK(three.launcher_exit_code() == 3);
  CHECK_FALSE(three.succeeded());
  CHECK(three.describe() == "exited with code 3");

  const WorkerExit killed = WorkerExit::from_wait_status(wait_status_of([] { raise(SIGKILL); }));
  CHECK(killed.kind == WorkerExit::Kind::kSignaled);
  CHECK(killed.launcher_exit_code() == 137);
  CHECK_THAT(killed.describe(), Contains("SIGKILL"));

  CHECK(WorkerExit::from_wait_status(wait_status_of([] {})).succeeded());
}

TEST_CASE("worker_status: signals have their usual names", "[worker_status]") {
  CHECK(signal_name(SIGTERM) == "SIGTERM");
  CHECK(signal_name(SIGSEGV) == "SIGSEGV");
  CHECK(signal_name(SIGRTMIN + 3) == "signal " + std::to_string(SIGRTMIN + 3));
}
