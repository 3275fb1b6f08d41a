// Event loop over the signal relay and the workers' output pipes: SIGCHLD means "reap", other signals
// are forwarded, readable pipes are copied out.
#include "workers/worker_group.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string.h>  // strsignal is POSIX, not in std::
#include <stdexcept>
#include <string>
#include <utility>

namespace cpprun::launcher {

WorkerExit WorkerExit::from_wait_status(int status) {
  if (WIFSIGNALED(status)) return signaled(WTERMSIG(status));
  return exited(WEXITSTATUS(status));
}

std::string WorkerExit::describe() const {
  if (kind == Kind::kExited) return "exited with code " + std::to_string(value);
  // strsignal gives the human words ("Killed"); the name is what people grep for.
  return "killed by " + signal_name(value) + " (" + ::strsignal(value) + ")";
}

std::string signal_name(int sig) {
  static constexpr std::pair<int, const char*> kNames[] = {
      {SIGHUP, "SIGHUP"},   {SIGINT, "SIGINT"},     {SIGQUIT, "SIGQUIT"}, {SIGILL, "SIGILL"},
      {SIGTRAP, "SIGTRAP"}, {SIGABRT, "SIGABRT"},   {SIGBUS, "SIGBUS"},   {SIGFPE, "SIGFPE"},
      {SIGKILL, "SIGKILL"}, {SIGUSR1, "SIGUSR1"},   {SIGSEGV, "SIGSEGV"}, {SIGUSR2, "SIGUSR2"},
      {SIGPIPE, "SIGPIPE"}, {SIGALRM, "SIGALRM"},   {SIGTERM, "SIGTERM"}, {SIGCHLD, "SIGCHLD"},
      {SIGCONT, "SIGCONT"}, {SIGSTOP, "SIGSTOP"},   {SIGTSTP, "SIGTSTP"}, {SIGTTIN, "SIGTTIN"},
      {SIGTTOU, "SIGTTOU"}, {SIGXCPU, "SIGXCPU"},   {SIGXFSZ, "SIGXFSZ"}, {SIGSYS, "SIGSYS"},
  };
  for (const auto& [number, name] : kNames) {
    if (number == sig) return name;
  }
  return "signal " + std::to_string(sig);
}

WorkerGroup::WorkerGroup(SignalRelay& relay) : relay_(relay) {
  // Ctrl-Z stops the workers and SIGCONT resumes them. See Note [Job control].
  relay_.set_job_control([this](int sig) { signal_groups(sig); });
}

WorkerGroup::~WorkerGroup() {
  relay_.set_job_control(nullptr);
  kill_remaining();
  // Whatever the workers wrote last still reaches the console and the files; then the pipes close.
  for (auto& output : outputs_) {
    output->out.drain();
    output->err.drain();
  }
}

void WorkerGroup::start(const std::vector<WorkerSpec>& specs, std::chrono::milliseconds grace) {
  std::vector<std::unique_ptr<WorkerOutput>> outputs;
  for (const WorkerSpec& spec : specs) outputs.push_back(std::make_unique<WorkerOutput>(spec.output));
  workers_.reserve(specs.size());
  outputs_.reserve(specs.size());
  for (std::size_t i = 0; i < specs.size(); ++i) {
    WorkerOutput& output = *outputs[i];
    try {
      WorkerRecord record;
      record.local_rank = specs[i].local_rank;
      record.rank = specs[i].rank;
      record.pid = spawn_worker(specs[i].command, {output.out.child_fd(), output.err.child_fd()}, relay_);
      // Only the worker may hold the write ends, or the pipes would never report EOF.
      output.out.close_child_end();
      output.err.close_child_end();
      workers_.push_back(record);
      outputs_.push_back(std::move(outputs[i]));
    } catch (const SpawnError&) {
      stop(StopStart::kSendSigterm, grace);
      throw;
    }
  }
}

GroupOutcome WorkerGroup::wait(PeerEvents* peers) {
  for (;;) {
    handle_events(WorkerState::kFinished);
    // A job-ending signal outranks a failure seen in the same wake-up: no restart after Ctrl-C.
    if (ending_signal_ != 0) return {GroupEnd::kInterrupted, root_cause_, ending_signal_};
    if (root_cause_) return {GroupEnd::kWorkerFailed, root_cause_, 0};
    if (running() == 0) return {GroupEnd::kSucceeded, std::nullopt, 0};
    if (peers != nullptr && peers->attempt_ended()) return {GroupEnd::kPeerEnded, std::nullopt, 0};
    wait_for_signal(-1, peers);
  }
}

void WorkerGroup::stop(StopStart how, std::chrono::milliseconds grace) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + grace;
  if (how == StopStart::kSendSigterm) signal_groups(SIGTERM);
  for (;;) {
    handle_events(WorkerState::kStoppedByLauncher);
    if (running() == 0) break;
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) break;
    wait_for_signal(static_cast<int>(std::min<long long>(left.count(), 1 << 30)));
  }
  kill_remaining();
}

void WorkerGroup::kill_remaining() {
  for (WorkerRecord& w : workers_) {
    const bool running = w.state == WorkerState::kRunning;
    if (running) w.sent_sigkill = true;
    // Orphans get as long as the workers took, no longer: nothing tells us when they exit.
    if (running || w.group_lingers) signal_process_group(w.pid, SIGKILL);
    w.group_lingers = false;
  }
  // SIGKILL cannot be caught, so these waits end as soon as the kernel tears the processes down.
  for (std::size_t i = 0; i < workers_.size(); ++i) {
    WorkerRecord& w = workers_[i];
    if (w.state != WorkerState::kRunning) continue;
    int status = 0;
    if (wait_for_exit(w.pid, &status) == w.pid) {
      record_exit(i, status, WorkerState::kStoppedByLauncher);
    } else {
      w.state = WorkerState::kStoppedByLauncher;
    }
  }
}

void WorkerGroup::record_exit(std::size_t i, int status, WorkerState state) {
  WorkerRecord& w = workers_[i];
  w.exit = WorkerExit::from_wait_status(status);
  w.state = state;
  outputs_[i]->out.drain();
  outputs_[i]->err.drain();
}

void WorkerGroup::handle_events(WorkerState exit_state) {
  for (int sig : relay_.take_pending()) {
    if (sig == SIGCHLD) continue;  // reap() below looks at every worker anyway
    // Forward before reaping: an unreaped worker's pid still names its process group.
    signal_groups(sig);
    if (ends_job(sig) && ending_signal_ == 0) ending_signal_ = sig;
  }
  // Once a job-ending signal went out, a worker that exits did so because of it (its handler can
  // run before we get here): it was stopped, it is not a root cause.
  reap(ending_signal_ != 0 ? WorkerState::kStoppedByLauncher : exit_state);
}

void WorkerGroup::reap(WorkerState exit_state) {
  // Rank order, so when several workers fail in one wake-up the lowest rank is the root cause.
  for (std::size_t i = 0; i < workers_.size(); ++i) {
    WorkerRecord& w = workers_[i];
    if (w.state != WorkerState::kRunning) continue;
    int status = 0;
    const pid_t got = wait_for_exit(w.pid, &status, WNOHANG);
    if (got == 0) continue;
    if (got < 0) {
      // Only a bug (someone else reaped our child) gets here.
      throw std::logic_error("cpprun: waitpid(" + std::to_string(w.pid) + ") for rank " +
                             std::to_string(w.rank) + " failed: " + std::strerror(errno));
    }
    on_exit(i, status, exit_state);
  }
  // Orphans cpprun adopted (Note [The job's process tree]) would stay zombies until the attempt
  // ends; a worker that exited since the loop above may turn up here too.
  for (;;) {
    int status = 0;
    const pid_t got = wait_for_exit(-1, &status, WNOHANG);
    if (got <= 0) break;
    for (std::size_t i = 0; i < workers_.size(); ++i) {
      if (workers_[i].pid == got && workers_[i].state == WorkerState::kRunning) on_exit(i, status, exit_state);
    }
  }
}

void WorkerGroup::on_exit(std::size_t i, int status, WorkerState exit_state) {
  WorkerRecord& w = workers_[i];
  record_exit(i, status, exit_state);
  // Probed at once, while the group id cannot be reused: Note [Orphans in a worker's process group].
  const bool ends_attempt = exit_state == WorkerState::kStoppedByLauncher || !w.exit->succeeded();
  w.group_lingers = ends_attempt && kill(-w.pid, 0) == 0;
  if (exit_state == WorkerState::kFinished && !w.exit->succeeded() && !root_cause_) root_cause_ = i;
}

void WorkerGroup::wait_for_signal(int timeout_ms, PeerEvents* peers) {
  std::vector<pollfd> fds{{relay_.wake_fd(), POLLIN, 0}};
  std::vector<OutputStream*> streams{nullptr};  // parallel to fds; null for the relay and peers
  for (auto& output : outputs_) {
    for (OutputStream* stream : {&output->out, &output->err}) {
      if (stream->read_fd() < 0) continue;
      fds.push_back({stream->read_fd(), POLLIN, 0});
      streams.push_back(stream);
    }
  }
  const std::size_t first_peer = fds.size();
  if (peers != nullptr) {
    for (int fd : peers->fds()) fds.push_back({fd, POLLIN, 0});
  }
  // EINTR just means a handler ran; the caller looks at the relay either way.
  if (poll(fds.data(), fds.size(), timeout_ms) < 0) {
    if (errno == EINTR) return;
    throw std::runtime_error(std::string("cpprun: poll() failed: ") + std::strerror(errno));
  }
  // POLLHUP without POLLIN is EOF, which pump() reads as such.
  for (std::size_t i = 1; i < first_peer; ++i) {
    if (fds[i].revents != 0) streams[i]->pump();
  }
  for (std::size_t i = first_peer; i < fds.size(); ++i) {
    if (fds[i].revents != 0) peers->on_readable(fds[i].fd);
  }
}

void WorkerGroup::signal_groups(int sig) {
  for (const WorkerRecord& w : workers_) {
    if (w.state == WorkerState::kRunning || w.group_lingers) signal_process_group(w.pid, sig);
  }
}

std::size_t WorkerGroup::running() const {
  return std::count_if(workers_.begin(), workers_.end(),
                       [](const WorkerRecord& w) { return w.state == WorkerState::kRunning; });
}

}  // namespace cpprun::launcher
