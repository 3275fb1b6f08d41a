// Start, wait, stop and summarise one attempt of this node's workers.
#include "workers/attempt.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string.h>  // strsignal is POSIX, not in std::
#include <iostream>
#include <memory>
#include <set>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "common/formatting.h"
#include "workers/console_sink.h"
#include "workers/error_file.h"
#include "workers/flight_requests.h"
#include "workers/job_process_tree.h"
#include "workers/kill_wait.h"
#include "workers/restart_backoff.h"
#include "workers/run_directory.h"
#include "workers/uninterruptible_watch.h"
#include "workers/worker_output.h"

namespace cpprun::launcher {
namespace {

// The root cause's error file, shown in full up to this size.
constexpr std::size_t kErrorFileLimit = 16 * 1024;
// Read whole to find when a worker reported its failure (the key follows the message).
constexpr std::size_t kErrorFileScanLimit = 1024 * 1024;
// How long the workers that record collectives get to dump them when the attempt fails: writing
// takes milliseconds; a rank stuck so badly that it cannot is named as such.
constexpr std::chrono::milliseconds kDumpWait{2000};

std::string fate(const WorkerRecord& w, const AttemptSummary& summary) {
  const std::string how = w.exit ? w.exit->describe() : "exit status unknown";
  const std::string grace = "--shutdown_timeout=" + decimal_seconds(summary.shutdown_timeout) + "s";
  if (w.state == WorkerState::kRunning) return "still running";
  if (w.state == WorkerState::kFinished) {
    return w.exit && w.exit->succeeded() ? "had finished (exited with code 0)" : "also failed: " + how;
  }
  if (w.state == WorkerState::kAbandoned) {
    return "not stopped: did not exit within " + grace + " of " + signal_name(summary.stop_signal) + " nor within " +
           decimal_seconds(summary.kill_wait) + "s of SIGKILL; left behind (uninterruptible sleep?)";
  }
  if (!w.sent_sigkill) return "stopped: " + how;
  return "stopped: did not exit within " + grace + ", " + how;
}

// "rank 1 (local_rank 1, pid 4242)"
std::string describe_worker(const WorkerRecord& worker) {
  return "rank " + std::to_string(worker.rank) + " (local_rank " + std::to_string(worker.local_rank) +
         ", pid " + std::to_string(worker.pid) + ")";
}

enum class StopStart {
  kSendSigterm,       // a worker failed: ask the others to finish
  kAlreadySignalled,  // wait() forwarded a job-ending signal; sending more would cut short the
                      // workers' own clean-up (a second SIGINT interrupts Python's `finally`)
};

// Supervises one attempt's workers: an event loop over the signal relay and the workers' output
// pipes, where SIGCHLD means "reap", other signals are forwarded and readable pipes are copied out.
//
// Note [Orphans in a worker's process group]
// A worker's group outlives it while its children run on (`./helper & exit 1`). Probed at reap
// time (kill(-pgid, 0)), such a group gets the signals forwarded and is SIGKILLed once the other
// workers are gone. Only failed and stopped workers are probed: their groups are signalled moments
// later, while the orphans still pin the id, so it cannot name another group. Other leftovers are
// stopped when the attempt ends (Note [The job's process tree]; torchrun leaves them running).
class WorkerGroup {
 public:
  explicit WorkerGroup(SignalRelay& relay) : relay_(relay) {
    // Ctrl-Z stops the workers and SIGCONT resumes them. See Note [Job control].
    relay_.set_job_control([this](int sig) {
      signal_groups(sig);
      // A stop is no wedge: a worker whose child stopped in vfork() shows D all the while.
      if (sig == SIGCONT && dstate_) dstate_->forget_all();
    });
  }

  // Never leaves a worker behind, even when unwinding from an exception: SIGKILLs and reaps.
  ~WorkerGroup() {
    relay_.set_job_control(nullptr);
    kill_remaining();
    // Whatever the workers wrote last still reaches the console and the files; then the pipes close.
    for (auto& output : outputs_) output->drain();
    // A job that dumped nothing (any job not on NCCL) leaves the log dir as torchrun would.
    if (!nccl_trace_dir_.empty()) rmdir(nccl_trace_dir_.c_str());
  }

  const std::string& nccl_trace_dir() const { return nccl_trace_dir_; }

  WorkerGroup(const WorkerGroup&) = delete;
  WorkerGroup& operator=(const WorkerGroup&) = delete;

  // Creates every worker's pipes and log files (std::system_error), then starts the workers in
  // order. If one cannot start, those already running are stopped and the SpawnError is rethrown.
  void start(const std::vector<WorkerSpec>& specs, std::chrono::milliseconds grace,
             const UninterruptibleStateSettings& uninterruptible, std::string diagnosis_file, PeerEvents* peers) {
    grace_ = grace;
    if (uninterruptible.enabled()) {
      dstate_.emplace(uninterruptible.timeout_s, uninterruptible.interval);
      dstate_interval_ = uninterruptible.interval;
      // As torchrun's agent, which sleeps --monitor_interval before its first look.
      next_check_ = std::chrono::steady_clock::now() + dstate_interval_;
    }
    diagnosis_file_ = std::move(diagnosis_file);
    peers_ = peers;
    for (const WorkerSpec& spec : specs) {
      outputs_.push_back(std::make_unique<WorkerOutput>(spec.output));
      channels_.push_back(std::make_unique<FlightRequestChannel>());
    }
    if (!specs.empty()) flight_recorder_dir_ = specs.front().flight_recorder_dir;
    if (!specs.empty()) nccl_trace_dir_ = specs.front().nccl_trace_dir;
    if (!nccl_trace_dir_.empty()) {
      // PyTorch writes <prefix><rank> and makes no directory: without this one its dump would be lost.
      std::error_code error;
      std::filesystem::create_directories(nccl_trace_dir_, error);
      if (error) {
        std::cerr << "cpprun: warning: cannot create " << nccl_trace_dir_ << " for PyTorch's NCCL flight-recorder "
                  << "dumps (" << error.message() << "); a rank's dump on an NCCL timeout will be lost\n";
      }
    }
    for (std::size_t i = 0; i < specs.size(); ++i) {
      WorkerOutput& output = *outputs_[i];
      try {
        const ChildStdio stdio{output.out.child_fd(), output.err.child_fd(), channels_[i]->child_fd(),
                               kFlightRequestFd};
        const pid_t pid = spawn_worker(specs[i].command, stdio, relay_);
        WorkerRecord record;
        record.local_rank = specs[i].local_rank;
        record.rank = specs[i].rank;
        record.pid = pid;
        workers_.push_back(record);
      } catch (const SpawnError&) {
        stop(StopStart::kSendSigterm, grace);
        throw;
      }
      // Only the worker may hold the write ends, or the pipes would never report EOF.
      output.out.close_child_end();
      output.err.close_child_end();
      channels_[i]->close_child_end();
    }
  }

  // Every worker's flight-recorder dump: the running ones that record collectives are asked for one
  // and given up to `timeout`, while their output keeps flowing. See workers/flight_requests.h.
  std::vector<RankEvidence> gather_dumps(std::chrono::milliseconds timeout) {
    if (flight_recorder_dir_.empty()) return {};
    std::vector<DumpSource> sources;
    for (std::size_t i = 0; i < workers_.size(); ++i) {
      const WorkerRecord& w = workers_[i];
      // One SIGKILLed and not yet reaped (in the wait after SIGKILL) can write no dump: not asked.
      const bool running = w.state == WorkerState::kRunning && !w.sent_sigkill;
      std::string fate = w.exit ? w.exit->describe() : "ended";
      if (running) fate = kStillRunning;
      if (w.state == WorkerState::kRunning && w.sent_sigkill) {
        fate = "SIGKILLed, not exited yet (uninterruptible sleep, D state?); given up on " +
               decimal_seconds(wait_after_sigkill(grace_)) + "s after the SIGKILL";
      }
      if (w.state == WorkerState::kAbandoned) fate = "SIGKILLed, did not exit; given up on";
      sources.push_back({w.rank, running, fate, channels_[i].get()});
    }
    return gather_flight_dumps(flight_recorder_dir_, sources, timeout,
                               [this](int ms) { wait_for_signal(ms, peers_); });
  }

  // Blocks until every worker succeeded, one failed, a job-ending signal arrived, or the peers (if
  // any) say another node ended the attempt, forwarding signals to the workers' groups meanwhile.
  GroupEnd wait() {
    for (;;) {
      handle_events(WorkerState::kFinished);
      // A job-ending signal outranks a failure seen in the same wake-up: no restart after Ctrl-C.
      if (ending_signal_ != 0) return GroupEnd::kInterrupted;
      if (root_cause_) return GroupEnd::kWorkerFailed;
      if (running() == 0) return GroupEnd::kSucceeded;
      if (peers_ != nullptr && peers_->attempt_ended()) return GroupEnd::kPeerEnded;
      if (found_unhealthy()) return GroupEnd::kUnhealthy;
      wait_for_signal(until_next_check(), peers_);
    }
  }

  // Signals the running workers' groups (per `how`), waits up to `grace`, then SIGKILLs the groups
  // still running or lingering and reaps them. Signals arriving meanwhile are still forwarded.
  void stop(StopStart how, std::chrono::milliseconds grace) {
    using Clock = std::chrono::steady_clock;
    const auto deadline = Clock::now() + grace;
    if (how == StopStart::kSendSigterm) signal_groups(SIGTERM);
    for (;;) {
      handle_events(WorkerState::kStoppedByLauncher);
      if (running() == 0) break;
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) break;
      // The peers are read too: another node's evidence may be on its way (Note [One diagnosis for several nodes]).
      wait_for_signal(static_cast<int>(std::min<long long>(left.count(), 1 << 30)), peers_);
    }
    kill_remaining();
  }

  // The first job-ending signal cpprun received in wait() or stop(); 0 if none. One that comes
  // while a failure's workers are being stopped still means "do not restart".
  int ending_signal() const { return ending_signal_; }
  // kUnhealthy: the stuck worker (the lowest rank of those stuck) and how, for the summary.
  const std::string& unhealthy_worker() const { return unhealthy_worker_; }
  const std::string& unhealthy_how() const { return unhealthy_how_; }
  // The index in workers() of the first failure, if any.
  std::optional<std::size_t> root_cause() const { return root_cause_; }

  const std::vector<WorkerRecord>& workers() const { return workers_; }
  std::vector<std::string> stderr_tail(std::size_t i) const { return outputs_.at(i)->err.tail().lines(); }

 private:
  // Note [A worker SIGKILL cannot end]
  // A worker in uninterruptible sleep (D state: wedged in a GPU or NIC driver, on a hung NFS or FUSE
  // mount, in a frozen cgroup) does not end on SIGKILL until the kernel lets go of it. As torchrun
  // 2.15 (multiprocessing/api.py SubprocessContext._close: proc.wait(timeout) after SIGKILL, then
  // "abandoning and continuing teardown"), cpprun waits a while after the SIGKILL (Note [The wait
  // after SIGKILL] in kill_wait.h), then gives up on those left: names them, SIGKILLs what they
  // started outside their process group (which would otherwise outlive the job), and goes on with
  // the exit code the attempt already had. They stay cpprun's children: reaped if they end while it
  // runs, by init (or an outer subreaper) once it has exited; no other wait waits for them again.
  // torchrun waits its timeout for each stuck worker in turn; cpprun for all of them at once.
  void kill_remaining() {
    using Clock = std::chrono::steady_clock;
    // Lingering groups too: their orphans get as long as the workers took, no longer (nothing tells us when they exit).
    signal_groups(SIGKILL);
    std::vector<pid_t> killed;
    for (WorkerRecord& w : workers_) {
      w.group_lingers = false;
      if (w.state == WorkerState::kRunning) {
        w.sent_sigkill = true;
        killed.push_back(w.pid);
      }
    }
    const std::chrono::milliseconds wait = wait_after_sigkill(grace_);
    const auto deadline = Clock::now() + wait;
    AfterKill next;
    for (;;) {
      std::set<pid_t> live;
      for (std::size_t i = 0; i < workers_.size(); ++i) {
        if (workers_[i].state != WorkerState::kRunning) continue;
        if (int status = 0; wait_for_exit(workers_[i].pid, &status, WNOHANG) == workers_[i].pid) {
          record_exit(i, status, WorkerState::kStoppedByLauncher);
        } else {
          live.insert(workers_[i].pid);
        }
      }
      next = decide_after_kill(killed, live, deadline, Clock::now());
      if (!next.keep_waiting) break;
      // SIGCHLD wakes this. A job-ending signal meanwhile is kept (no restart), not forwarded (all are
      // SIGKILLed), nor does it shorten the wait (docs/launcher.md); `cpprun --diagnose` is answered now:
      // its requester would otherwise wait for its own timeout.
      relay_.wait_until(deadline);
      for (int sig : relay_.take_pending()) {
        if (ends_job(sig) && ending_signal_ == 0) ending_signal_ = sig;
        if (sig == diagnose_signal()) answer_diagnose_in_kill_wait();
      }
    }
    for (pid_t pid : next.abandon) {
      const std::size_t i = static_cast<std::size_t>(
          std::find_if(workers_.begin(), workers_.end(), [pid](const WorkerRecord& w) { return w.pid == pid; }) -
          workers_.begin());
      WorkerRecord& w = workers_[i];
      w.state = WorkerState::kAbandoned;
      outputs_[i]->drain();
      const std::size_t descendants = abandon_child(w.pid);
      std::cerr << "cpprun: error: " << describe_worker(w) << " did not exit within " << decimal_seconds(wait)
                << "s of SIGKILL; abandoning it and going on. It may be in uninterruptible kernel sleep (D state, "
                   "e.g. wedged on a GPU or NIC); the host may need to be recycled"
                << (descendants == 0 ? "" : " (SIGKILLed its " + std::to_string(descendants) +
                                                " live descendants too)")
                << "\n";
    }
  }

  // Note [Time in D state] in uninterruptible_watch.h: at each --monitor_interval tick, the running
  // workers' states; true (once) when one has stayed in D past the timeout (Note [An unhealthy attempt]).
  bool found_unhealthy() {
    if (!dstate_) return false;
    const auto now = std::chrono::steady_clock::now();
    if (now < next_check_) return false;
    next_check_ = now + dstate_interval_;
    std::vector<ProcessStateSample> samples;
    for (const WorkerRecord& w : workers_) {
      if (w.state != WorkerState::kRunning) continue;
      samples.push_back({w.pid, parse_stat_state(read_proc_file("/proc/" + std::to_string(w.pid) + "/stat"))});
    }
    const UninterruptibleWatch::Step step = dstate_->observe(samples, now);
    const auto worker_of = [this](pid_t pid) -> const WorkerRecord& {
      return *std::find_if(workers_.begin(), workers_.end(), [pid](const WorkerRecord& w) { return w.pid == pid; });
    };
    for (pid_t pid : step.entered) {
      std::cerr << entered_uninterruptible_line(describe_worker(worker_of(pid)), dstate_->timeout_s()) << "\n";
    }
    if (step.stuck.empty()) return false;
    for (const UninterruptibleWatch::Stuck& stuck : step.stuck) {
      std::string wchan = read_proc_file("/proc/" + std::to_string(stuck.pid) + "/wchan");
      while (!wchan.empty() && (wchan.back() == '\n' || wchan.back() == ' ')) wchan.pop_back();
      std::cerr << stuck_uninterruptible_error(describe_worker(worker_of(stuck.pid)), stuck.pid,
                                               stuck_uninterruptible_how(stuck.dwell_s, dstate_->timeout_s()), wchan)
                << "\n";
    }
    // The samples are in rank order: the lowest rank stuck is named.
    unhealthy_worker_ = describe_worker(worker_of(step.stuck.front().pid));
    unhealthy_how_ = stuck_uninterruptible_how(step.stuck.front().dwell_s, dstate_->timeout_s());
    return true;
  }

  // poll()'s timeout until the next D-state tick; -1 (none) when the check is off.
  int until_next_check() const {
    if (!dstate_) return -1;
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(next_check_ - std::chrono::steady_clock::now());
    return static_cast<int>(std::clamp<long long>(left.count(), 0, 1 << 30));
  }

  // Records how worker i ended and copies out everything it wrote (Note [Worker output pipes]).
  void record_exit(std::size_t i, int status, WorkerState state) {
    WorkerRecord& w = workers_[i];
    w.exit = WorkerExit::from_wait_status(status);
    w.state = state;
    outputs_[i]->drain();
  }

  void handle_events(WorkerState exit_state) {
    // Until none is pending, those taken while a diagnosis was being answered included (each once).
    for (;;) {
      std::vector<int> signals = std::exchange(deferred_signals_, {});
      for (int sig : relay_.take_pending()) signals.push_back(sig);
      if (signals.empty()) break;
      std::sort(signals.begin(), signals.end());
      signals.erase(std::unique(signals.begin(), signals.end()), signals.end());
      for (int sig : signals) {
        if (sig == SIGCHLD) continue;  // reap() below looks at every worker anyway
        if (sig == diagnose_signal()) {  // cpprun --diagnose: answered, not forwarded
          answer_diagnose();
          continue;
        }
        // Forward before reaping: an unreaped worker's pid still names its process group.
        signal_groups(sig);
        if (ends_job(sig) && ending_signal_ == 0) ending_signal_ = sig;
      }
    }
    // Once a job-ending signal went out, a worker that exits did so because of it (its handler can
    // run before we get here): it was stopped, it is not a root cause.
    reap(ending_signal_ != 0 ? WorkerState::kStoppedByLauncher : exit_state);
    // Node 0 asked for this node's part of a diagnosis (again, if it asked while this node answered);
    // not while stopping: the failure path sends its evidence anyway.
    while (exit_state == WorkerState::kFinished && ending_signal_ == 0 && !root_cause_ && peers_ != nullptr) {
      const int request = peers_->take_evidence_request();
      if (request == 0) break;
      answer_node_zero(request);
    }
  }

  // Where each rank is now: printed on this console, and written to each requester's file when
  // `cpprun --diagnose` asked (a plain kill gets the console alone). Requests that came together get
  // one answer. On the host of a multi-node job, every node's ranks: Note [Diagnosis on request
  // across nodes] in node_rendezvous.h.
  //
  // `in_kill_wait`: asked in the wait after SIGKILL (Note [A worker SIGKILL cannot end]). The attempt
  // is over: no other node is asked (this node's ranks alone), and the SIGKILLed workers, which can
  // write no dump, are named as such (gather_dumps()).
  void answer_diagnose(bool in_kill_wait = false) {
    const std::vector<DiagnoseRequest> requests = take_diagnose_requests();
    std::string why = "asked by " + diagnose_askers(requests);
    if (in_kill_wait) why += "; the attempt is ending: cpprun waits for its SIGKILLed workers to exit";
    const int request = peers_ != nullptr && !in_kill_wait ? peers_->ask_nodes_for_evidence() : 0;
    std::vector<RankEvidence> evidence = gather_dumps(kDumpWait);
    if (request != 0) evidence = collect_other_nodes(request, std::move(evidence));
    std::string text = report_diagnosis(evidence, why, diagnosis_file_, true, nccl_trace_dir_);
    if (const std::string note = peers_ != nullptr && !in_kill_wait ? peers_->partial_answer_note() : "";
        !note.empty()) {
      std::cerr << note << std::flush;
      text += note;
    }
    for (const DiagnoseRequest& r : requests) answer_diagnose_request(r.requester, r.reply_fd, text);
  }

  // From kill_remaining(), which also runs in ~WorkerGroup: nothing may escape.
  void answer_diagnose_in_kill_wait() noexcept {
    try {
      answer_diagnose(true);
    } catch (const std::exception& e) {
      std::cerr << "cpprun: warning: could not answer cpprun --diagnose while stopping the workers: " << e.what()
                << "\n";
    }
  }

  // The host, after asking the other nodes for request `request`: waits up to kEvidenceWait past its
  // own ranks' dumps for their answers, while the workers' output keeps flowing, then merges. A
  // pending signal (a worker's exit, Ctrl-C) or the attempt's end cuts the wait short: what came is
  // answered, the rest named, and the main loop acts on the signal.
  std::vector<RankEvidence> collect_other_nodes(int request, std::vector<RankEvidence> own) {
    using Clock = std::chrono::steady_clock;
    const auto started = Clock::now();
    const auto deadline = started + kEvidenceWait;
    while (peers_->evidence_owed(request) && !peers_->attempt_ended()) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) break;
      if (relay_pending()) {
        // Kept for handle_events(); another `cpprun --diagnose` alone waits for this answer to end.
        const std::vector<int> signals = relay_.take_pending();
        deferred_signals_.insert(deferred_signals_.end(), signals.begin(), signals.end());
        if (std::any_of(signals.begin(), signals.end(), [](int sig) { return sig != diagnose_signal(); })) break;
        continue;
      }
      wait_for_signal(static_cast<int>(std::min<long long>(left.count(), 100)), peers_);
    }
    const auto waited = std::min<std::chrono::milliseconds>(
        kEvidenceWait, std::chrono::ceil<std::chrono::milliseconds>(Clock::now() - started));
    MergedEvidence merged = peers_->close_evidence_request(request, std::move(own), waited);
    for (const std::string& refused : merged.refused) std::cerr << "cpprun: warning: " << refused << "\n";
    return std::move(merged.ranks);
  }

  // A member: node 0 asked for this node's ranks (its `cpprun --diagnose`); they go back to it.
  void answer_node_zero(int request) {
    const std::vector<RankEvidence> evidence = gather_dumps(kDumpWait);
    peers_->answer_evidence_request(request, evidence);
    std::cerr << "cpprun: node 0 asked for this node's ranks' flight-recorder dumps (cpprun --diagnose there, "
                 "request " << request << "); sent them\n" << std::flush;
  }

  // A signal waits in the relay.
  bool relay_pending() const {
    pollfd wake{relay_.wake_fd(), POLLIN, 0};
    return poll(&wake, 1, 0) > 0;
  }

  void reap(WorkerState exit_state) {
    // Rank order, so when several workers fail in one wake-up the lowest rank is the root cause.
    for (std::size_t i = 0; i < workers_.size(); ++i) {
      const WorkerRecord& w = workers_[i];
      if (w.state != WorkerState::kRunning) continue;
      int status = 0;
      const pid_t got = wait_for_exit(w.pid, &status, WNOHANG);
      if (got < 0) {  // only a bug: someone else reaped our child
        throw std::logic_error("cpprun: waitpid(" + std::to_string(w.pid) + ") failed: " + std::strerror(errno));
      }
      if (got > 0) on_exit(i, status, exit_state);
    }
    // Orphans cpprun adopted (Note [The job's process tree]) would stay zombies until the attempt
    // ends; a worker that exited since the loop above may turn up here too.
    int status = 0;
    for (pid_t got; (got = wait_for_exit(-1, &status, WNOHANG)) > 0;) {
      forget_abandoned(got);  // a worker of an earlier attempt that cpprun gave up on, ended at last
      if (keep_helper_status(got, status)) continue;  // Note [The job's helpers]
      for (std::size_t i = 0; i < workers_.size(); ++i) {
        if (workers_[i].pid == got && workers_[i].state == WorkerState::kRunning) on_exit(i, status, exit_state);
      }
    }
  }

  // Worker i was reaped in wait() or stop(): records it, and whether it is the root cause.
  void on_exit(std::size_t i, int status, WorkerState exit_state) {
    WorkerRecord& w = workers_[i];
    record_exit(i, status, exit_state);
    // Probed at once, while the group id cannot be reused: Note [Orphans in a worker's process group].
    const bool ends_attempt = exit_state == WorkerState::kStoppedByLauncher || !w.exit->succeeded();
    w.group_lingers = ends_attempt && kill(-w.pid, 0) == 0;
    if (exit_state == WorkerState::kFinished && !w.exit->succeeded() && !root_cause_) root_cause_ = i;
  }

  // Sleeps in poll() until a signal (SIGCHLD included), `peers` or the timeout wakes it, copying
  // whatever output arrives meanwhile.
  void wait_for_signal(int timeout_ms, PeerEvents* peers = nullptr) {
    std::vector<pollfd> fds{{relay_.wake_fd(), POLLIN, 0}};
    // The consoles with lines waiting, and the workers' pipes unless their console is behind
    // (Note [A console that does not read]: a worker then waits in its own write()).
    ConsoleWait consoles;
    consoles.add(fds);
    const std::size_t first_stream = fds.size();
    std::vector<OutputStream*> streams;  // parallel to fds from first_stream
    for (auto& output : outputs_) {
      for (OutputStream* stream : {&output->out, &output->err}) {
        const ConsoleSink& console = stream == &output->out ? ConsoleSink::out() : ConsoleSink::err();
        // Only a stream that feeds the console waits for it (--redirects, --local_ranks_filter).
        if (stream->read_fd() < 0 || (stream->feeds_console() && !console.accepts_more())) continue;
        fds.push_back({stream->read_fd(), POLLIN, 0});
        streams.push_back(stream);
      }
    }
    const std::size_t first_peer = fds.size();
    if (peers != nullptr) {
      for (const pollfd& fd : peers->poll_fds()) fds.push_back(fd);
    }
    // EINTR just means a handler ran; the caller looks at the relay either way.
    if (poll(fds.data(), fds.size(), PeerEvents::poll_timeout(fds, timeout_ms)) < 0) {
      if (errno == EINTR) return;
      throw std::runtime_error(std::string("cpprun: poll() failed: ") + std::strerror(errno));
    }
    consoles.after(fds);
    // POLLHUP without POLLIN is EOF, which pump() reads as such.
    for (std::size_t i = first_stream; i < first_peer; ++i) {
      if (fds[i].revents != 0) streams[i - first_stream]->pump();
    }
    if (peers != nullptr) peers->dispatch(fds, first_peer);
  }

  void signal_groups(int sig) {
    for (const WorkerRecord& w : workers_) {
      if (w.state == WorkerState::kRunning || w.group_lingers) signal_process_group(w.pid, sig);
    }
  }

  std::size_t running() const {
    return std::count_if(workers_.begin(), workers_.end(),
                         [](const WorkerRecord& w) { return w.state == WorkerState::kRunning; });
  }

  SignalRelay& relay_;
  std::vector<WorkerRecord> workers_;
  std::vector<std::unique_ptr<WorkerOutput>> outputs_;  // one per spec: workers_[i] writes to outputs_[i]
  std::vector<std::unique_ptr<FlightRequestChannel>> channels_;  // one per spec, likewise
  std::string flight_recorder_dir_;
  std::string nccl_trace_dir_;  // PyTorch's NCCL dumps; "" when the user chose where they go
  std::string diagnosis_file_;
  PeerEvents* peers_ = nullptr;  // multi-node: the other agents' news, read while waiting
  std::vector<int> deferred_signals_;  // taken while answering cpprun --diagnose, not yet acted on
  std::optional<std::size_t> root_cause_;
  int ending_signal_ = 0;
  std::chrono::milliseconds grace_{0};            // --shutdown_timeout: also the wait after SIGKILL
  std::optional<UninterruptibleWatch> dstate_;    // TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT, if set
  std::chrono::milliseconds dstate_interval_{0};  // --monitor_interval
  std::chrono::steady_clock::time_point next_check_{};
  std::string unhealthy_worker_;
  std::string unhealthy_how_;
};

}  // namespace

int PeerEvents::poll_timeout(const std::vector<pollfd>& fds, int timeout_ms) {
  const bool writing = std::any_of(fds.begin(), fds.end(), [](const pollfd& fd) { return (fd.events & POLLOUT) != 0; });
  if (!writing) return timeout_ms;
  return timeout_ms < 0 ? kWriteCheckMs : std::min(timeout_ms, kWriteCheckMs);
}

void PeerEvents::dispatch(const std::vector<pollfd>& fds, std::size_t first) {
  for (std::size_t i = first; i < fds.size(); ++i) {
    if (fds[i].revents != 0 || (fds[i].events & POLLOUT) != 0) on_ready(fds[i].fd, fds[i].revents);
  }
}

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

AttemptEnd run_attempt(SignalRelay& relay, const std::vector<WorkerSpec>& specs,
                       std::chrono::milliseconds shutdown_timeout, const UninterruptibleStateSettings& uninterruptible,
                       PeerEvents* peers, const std::function<void(const AttemptEnd&)>& before_stop,
                       const std::string& diagnosis_file, const EvidenceRoute* route) {
  WorkerGroup group(relay);
  group.start(specs, shutdown_timeout, uninterruptible, diagnosis_file, peers);
  const GroupEnd end = group.wait();
  if (end == GroupEnd::kSucceeded) {
    // See Note [The job's process tree]. A job-ending signal that cut the grace short is raised
    // again, for whatever waits next (the exit barrier of a multi-node job) to act on.
    if (const int sig = stop_leftovers(relay, shutdown_timeout); sig != 0) raise(sig);
    return {};
  }
  std::optional<std::size_t> root = group.root_cause();
  AttemptEnd result{end, 0, group.ending_signal(), "", "", "", 0};
  const auto blame = [&](std::size_t index) {
    const WorkerRecord& worker = group.workers().at(index);
    result = {end, worker.exit->launcher_exit_code(), result.signal, describe_worker(worker), worker.exit->describe(),
              specs.at(index).error_file,
              worker.exit->kind == WorkerExit::Kind::kSignaled ? -worker.exit->value : worker.exit->value};
  };
  if (root) blame(*root);
  if (end == GroupEnd::kInterrupted) result.exit_code = 128 + result.signal;
  if (end == GroupEnd::kUnhealthy) {  // Note [An unhealthy attempt]: 1, as torchrun for a failed worker
    result.exit_code = 1;
    result.root_worker = group.unhealthy_worker();
    result.root_how = group.unhealthy_how();
  }
  if (before_stop) before_stop(result);
  // A failure here or on another node: where every rank of this node was, before they are stopped.
  std::vector<RankEvidence> evidence;
  std::string why;
  if (end == GroupEnd::kWorkerFailed || end == GroupEnd::kUnhealthy) {
    evidence = group.gather_dumps(kDumpWait);
    why = result.root_worker + " " + result.root_how;
  } else if (end == GroupEnd::kPeerEnded) {
    evidence = group.gather_dumps(kDumpWait);
    why = peers->end_reason();
  } else {
    why = "cpprun received " + signal_name(result.signal);  // said only if PyTorch's NCCL dumps are there
  }
  if (route != nullptr && route->share && end != GroupEnd::kInterrupted) route->share(evidence);

  group.stop(end == GroupEnd::kInterrupted ? StopStart::kAlreadySignalled : StopStart::kSendSigterm, shutdown_timeout);
  // Every worker has ended: the one that reported its failure first may not be the first that
  // exited (Note [The root cause by report time]). Not in a multi-node job (`before_stop`): the
  // other nodes were told of the first already, and the job's exit code and summary are theirs too.
  if (root && end == GroupEnd::kWorkerFailed && !before_stop) {
    std::vector<std::optional<long long>> failed_at_ms(group.workers().size());
    for (std::size_t i = 0; i < failed_at_ms.size(); ++i) {
      const WorkerRecord& worker = group.workers()[i];
      // One that cpprun's signal ended is not named: cpprun would exit 143 for a worker whose own
      // code it never saw.
      if (!worker.exit || worker.exit->succeeded() || worker.exit->kind != WorkerExit::Kind::kExited) continue;
      if (const auto text = read_file_head(specs.at(i).error_file, kErrorFileScanLimit)) failed_at_ms[i] = recorded_failure_ms(*text);
    }
    if (const std::size_t first = root_cause_by_report_time(*root, failed_at_ms); first != *root) {
      root = first;
      blame(first);
      why = result.root_worker + " " + result.root_how;
    }
  }
  AttemptSummary summary{root,
                         group.ending_signal(),
                         shutdown_timeout,
                         root ? group.stderr_tail(*root) : std::vector<std::string>{},
                         root ? read_file_head(specs.at(*root).error_file, kErrorFileLimit) : std::nullopt,
                         end == GroupEnd::kUnhealthy ? result.root_worker + " " + result.root_how : ""};
  // What stop() sent first: the job-ending signal it forwarded (Ctrl-C: SIGINT), else SIGTERM.
  summary.stop_signal = end == GroupEnd::kInterrupted ? result.signal : SIGTERM;
  summary.kill_wait = wait_after_sigkill(shutdown_timeout);
  summary.one_of_several_nodes = static_cast<bool>(before_stop);
  std::cerr << format_attempt_summary(group.workers(), summary);
  if (route != nullptr && route->report && end != GroupEnd::kInterrupted) {
    route->report(evidence, why, diagnosis_file);
    report_node_nccl_trace(group.nccl_trace_dir());  // on this host, not node 0's
  } else {
    report_diagnosis(evidence, why, diagnosis_file, false, group.nccl_trace_dir());
  }
  const int leftovers_signal = stop_leftovers(relay, shutdown_timeout);
  // A signal that arrived while stopping after a failure still means "do not restart".
  if (const int late = group.ending_signal() != 0 ? group.ending_signal() : leftovers_signal; late != 0) {
    result = {GroupEnd::kInterrupted, 128 + late, late, result.root_worker, result.root_how, "", 0};
  }
  return result;
}

std::string format_attempt_summary(const std::vector<WorkerRecord>& workers, const AttemptSummary& summary) {
  std::ostringstream out;
  if (summary.ending_signal != 0) {
    out << "cpprun: received " << signal_name(summary.ending_signal)
        << "; forwarded it to every worker and stopped them\n";
  }
  if (!summary.unhealthy.empty()) {
    out << "cpprun: " << summary.unhealthy << "; stopped every worker, no restart\n";
  }
  if (summary.root_cause) {
    const WorkerRecord& root = workers.at(*summary.root_cause);
    out << "cpprun: " << describe_worker(root)
        << (summary.one_of_several_nodes ? " failed first on this node: " : " failed first (root cause): ")
        << (root.exit ? root.exit->describe() : "exit status unknown") << "\n";
  }
  for (std::size_t i = 0; i < workers.size(); ++i) {
    if (summary.root_cause && i == *summary.root_cause) continue;
    out << "cpprun:   " << describe_worker(workers[i]) << " " << fate(workers[i], summary) << "\n";
  }
  if (!summary.root_cause) return out.str();
  // Last, next to the exit line: with many ranks, the root cause's own words scroll away.
  const std::string rank = "rank " + std::to_string(workers.at(*summary.root_cause).rank);
  if (!summary.root_cause_stderr_tail.empty()) {
    out << "cpprun: last lines of " << rank << "'s stderr:\n";
    for (const std::string& line : summary.root_cause_stderr_tail) out << "cpprun:   | " << line << "\n";
  }
  if (summary.root_cause_error_file) {
    out << "cpprun: " << rank << "'s error file (TORCHELASTIC_ERROR_FILE):\n";
    std::istringstream lines(*summary.root_cause_error_file);
    for (std::string line; std::getline(lines, line);) out << "cpprun:   | " << line << "\n";
  }
  return out.str();
}

}  // namespace cpprun::launcher
