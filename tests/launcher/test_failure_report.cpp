// Unit tests of the failure summary: root cause first, then what happened to the others.
#include <catch2/catch.hpp>

#include <csignal>

#include "failure_report.h"

using namespace cpprun::launcher;
using Catch::Matchers::Contains;

namespace {

WorkerRecord record(int rank, pid_t pid, WorkerState state, WorkerExit exit, bool sigkill = false) {
  WorkerRecord w;
  w.rank = w.local_rank = rank;
  w.pid = pid;
  w.state = state;
  w.exit = exit;
  w.sent_sigkill = sigkill;
  return w;
}

}  // namespace

TEST_CASE("failure_report: names the root cause and the stopped workers", "[failure_report]") {
  const std::vector<WorkerRecord> workers = {
      record(0, 100, WorkerState::kStoppedByLauncher, WorkerExit::signaled(SIGTERM)),
      record(1, 101, WorkerState::kFinished, WorkerExit::exited(3)),
      record(2, 102, WorkerState::kStoppedByLauncher, WorkerExit::signaled(SIGKILL), true),
  };
  const std::string text = format_attempt_summary(workers, {1, 0, std::chrono::seconds(1)});
  CHECK_THAT(text, Contains("rank 1 (local_rank 1, pid 101) failed first (root cause): exited with code 3"));
  CHECK_THAT(text, Contains("rank 0 (local_rank 0, pid 100) stopped: killed by SIGTERM"));
  CHECK_THAT(text, Contains("rank 2 (local_rank 2, pid 102) stopped: did not exit within --shutdown_timeout=1s"));
  CHECK(text.find("rank 1") < text.find("rank 0"));  // root cause first
}

TEST_CASE("failure_report: an interruption names the signal", "[failure_report]") {
  const std::vector<WorkerRecord> workers = {
      record(0, 100, WorkerState::kStoppedByLauncher, WorkerExit::exited(0)),
  };
  const std::string text = format_attempt_summary(workers, {std::nullopt, SIGTERM, std::chrono::seconds(5)});
  CHECK_THAT(text, Contains("received SIGTERM"));
  CHECK_THAT(text, Contains("rank 0 (local_rank 0, pid 100) stopped: exited with code 0"));
}
