// Unit tests of an attempt's vocabulary and report: exit-status decoding, the exit codes cpprun
// passes on, and the failure summary (root cause first, then what happened to the others).
#include "catch.h"

#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <utility>
#include <vector>

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

WorkerRecord record(int rank, pid_t pid, WorkerState state, WorkerExit exit, bool sigkill = false) {
  WorkerRecord w;
  w.rank = w.local_rank = rank;
  w.pid = pid;
  w.state = state;
  w.exit = exit;
  w.sent_sigkill = sigkill;
  return w;
}

AttemptSummary summary(std::optional<std::size_t> root_cause, int ending_signal,
                       std::chrono::milliseconds shutdown_timeout) {
  AttemptSummary s;
  s.root_cause = root_cause;
  s.ending_signal = ending_signal;
  s.shutdown_timeout = shutdown_timeout;
  return s;
}

}  // namespace

TEST_CASE("attempt: a worker's exit code passes through, signals become 128+N", "[attempt]") {
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

TEST_CASE("attempt: signals have their usual names", "[attempt]") {
  CHECK(signal_name(SIGTERM) == "SIGTERM");
  CHECK(signal_name(SIGSEGV) == "SIGSEGV");
  CHECK(signal_name(SIGRTMIN + 3) == "signal " + std::to_string(SIGRTMIN + 3));
}

TEST_CASE("attempt: the failure summary names the root cause and the stopped workers", "[attempt]") {
  const std::vector<WorkerRecord> workers = {
      record(0, 100, WorkerState::kStoppedByLauncher, WorkerExit::signaled(SIGTERM)),
      record(1, 101, WorkerState::kFinished, WorkerExit::exited(3)),
      record(2, 102, WorkerState::kStoppedByLauncher, WorkerExit::signaled(SIGKILL), true),
  };
  const std::string text = format_attempt_summary(workers, summary(1, 0, std::chrono::seconds(1)));
  CHECK_THAT(text, Contains("rank 1 (local_rank 1, pid 101) failed first (root cause): exited with code 3"));
  CHECK_THAT(text, Contains("rank 0 (local_rank 0, pid 100) stopped: killed by SIGTERM"));
  CHECK_THAT(text, Contains("rank 2 (local_rank 2, pid 102) stopped: did not exit within --shutdown_timeout=1s"));
  CHECK(text.find("rank 1") < text.find("rank 0"));  // root cause first
  // One node of several: its first failure, not necessarily the job's (Note [A job's root cause]).
  AttemptSummary node = summary(1, 0, std::chrono::seconds(1));
  node.one_of_several_nodes = true;
  const std::string node_text = format_attempt_summary(workers, node);
  CHECK_THAT(node_text, Contains("rank 1 (local_rank 1, pid 101) failed first on this node: exited with code 3"));
  CHECK_THAT(node_text, !Contains("root cause"));
}

TEST_CASE("attempt: the summary names a worker stuck in D state, and one that SIGKILL did not end", "[attempt]") {
  WorkerRecord abandoned = record(1, 101, WorkerState::kAbandoned, WorkerExit::exited(0), true);
  abandoned.exit.reset();  // never reaped
  const std::vector<WorkerRecord> workers = {
      record(0, 100, WorkerState::kStoppedByLauncher, WorkerExit::signaled(SIGTERM)),
      abandoned,
  };
  AttemptSummary s = summary(std::nullopt, 0, std::chrono::seconds(2));
  s.unhealthy = "rank 1 (local_rank 1, pid 101) stuck in uninterruptible sleep (D state) for 3.0 s";
  s.kill_wait = std::chrono::seconds(30);
  const std::string text = format_attempt_summary(workers, s);
  CHECK_THAT(text, Contains("cpprun: rank 1 (local_rank 1, pid 101) stuck in uninterruptible sleep (D state) for "
                            "3.0 s; stopped every worker, no restart\n"));
  CHECK_THAT(text, Contains("rank 0 (local_rank 0, pid 100) stopped: killed by SIGTERM"));
  CHECK_THAT(text, Contains("rank 1 (local_rank 1, pid 101) not stopped: did not exit within --shutdown_timeout=2s of "
                            "SIGTERM nor within 30s of SIGKILL; left behind"));
  CHECK(text.find("stuck") < text.find("rank 0 (local_rank 0"));
}

TEST_CASE("attempt: an abandoned worker's line names the signal forwarded and the real wait after SIGKILL",
          "[attempt]") {
  WorkerRecord abandoned = record(0, 100, WorkerState::kAbandoned, WorkerExit::exited(0), true);
  abandoned.exit.reset();
  AttemptSummary s = summary(std::nullopt, SIGINT, std::chrono::seconds(0));  // Ctrl-C, --shutdown_timeout=0
  s.stop_signal = SIGINT;
  s.kill_wait = std::chrono::seconds(30);
  const std::string text = format_attempt_summary({abandoned}, s);
  CHECK_THAT(text, Contains("rank 0 (local_rank 0, pid 100) not stopped: did not exit within --shutdown_timeout=0s of "
                            "SIGINT nor within 30s of SIGKILL; left behind"));
}

TEST_CASE("attempt: the failure summary of an interruption names the signal", "[attempt]") {
  const std::vector<WorkerRecord> workers = {
      record(0, 100, WorkerState::kStoppedByLauncher, WorkerExit::exited(0)),
  };
  const std::string text = format_attempt_summary(workers, summary(std::nullopt, SIGTERM, std::chrono::seconds(5)));
  CHECK_THAT(text, Contains("received SIGTERM"));
  CHECK_THAT(text, Contains("rank 0 (local_rank 0, pid 100) stopped: exited with code 0"));
}

TEST_CASE("attempt: the root cause's stderr tail and error file come last", "[attempt]") {
  const std::vector<WorkerRecord> workers = {
      record(0, 100, WorkerState::kStoppedByLauncher, WorkerExit::signaled(SIGTERM)),
      record(3, 103, WorkerState::kFinished, WorkerExit::exited(1)),
  };
  AttemptSummary s = summary(1, 0, std::chrono::seconds(5));
  s.root_cause_stderr_tail = {"Traceback (most recent call last):", "ValueError: bad batch"};
  s.root_cause_error_file = std::string("{\"message\": \"bad batch\"}\nsecond line");
  const std::string text = format_attempt_summary(workers, s);
  CHECK_THAT(text, Contains("cpprun: last lines of rank 3's stderr:\n"
                            "cpprun:   | Traceback (most recent call last):\n"
                            "cpprun:   | ValueError: bad batch\n"));
  CHECK_THAT(text, Contains("cpprun: rank 3's error file (TORCHELASTIC_ERROR_FILE):\n"
                            "cpprun:   | {\"message\": \"bad batch\"}\ncpprun:   | second line\n"));
  CHECK(text.find("rank 0 (local_rank 0") < text.find("last lines"));
  CHECK(text.find("last lines") < text.find("error file"));
}

TEST_CASE("attempt: no tail or error file section when there is none", "[attempt]") {
  const std::vector<WorkerRecord> workers = {record(0, 100, WorkerState::kFinished, WorkerExit::exited(2))};
  const std::string text = format_attempt_summary(workers, summary(0, 0, std::chrono::seconds(5)));
  CHECK(text.find("stderr") == std::string::npos);
  CHECK(text.find("error file") == std::string::npos);
}

TEST_CASE("attempt: a peer's link with bytes waiting is handed back after every poll, at least once a second",
          "[attempt]") {
  // What wait_for_signal and the rendezvous's poll_links do with the peers' poll_fds().
  struct Recorder : PeerEvents {
    std::vector<std::pair<int, short>> ready;
    std::vector<pollfd> poll_fds() const override { return {}; }
    void on_ready(int fd, short revents) override { ready.emplace_back(fd, revents); }
    bool attempt_ended() const override { return false; }
  } peers;
  const std::vector<pollfd> reading{{3, POLLIN, 0}, {5, POLLIN, 0}};
  CHECK(PeerEvents::poll_timeout(reading, -1) == -1);
  CHECK(PeerEvents::poll_timeout(reading, 5000) == 5000);
  // fds[0] is the caller's own (the signal relay); from 1 on, the peers': 5 idle, 6 with bytes
  // queued and not writable, 7 readable.
  const std::vector<pollfd> writing{{3, POLLIN, POLLIN}, {5, POLLIN, 0}, {6, POLLIN | POLLOUT, 0}, {7, POLLIN, POLLIN}};
  CHECK(PeerEvents::poll_timeout(writing, -1) == PeerEvents::kWriteCheckMs);
  CHECK(PeerEvents::poll_timeout(writing, 60000) == PeerEvents::kWriteCheckMs);
  CHECK(PeerEvents::poll_timeout(writing, 10) == 10);
  peers.dispatch(writing, 1);
  const std::vector<std::pair<int, short>> expected{{6, 0}, {7, POLLIN}};
  CHECK(peers.ready == expected);
}
