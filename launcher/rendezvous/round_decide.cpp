// See round_decide.h: each event's handler, then the gathering window and what follows an attempt
// (Note [Elastic rounds] in node_rendezvous.h).
#include "rendezvous/round_decide.h"

#include <algorithm>
#include <utility>

#include "rendezvous/admission.h"
#include "rendezvous/node_rendezvous.h"
#include "rendezvous/round_outcome.h"
#include "rendezvous/round_plan.h"
#include "workers/attempt.h"

namespace cpprun::launcher {
namespace {

// One step's work: the settings, the state it changes, the clock it was given, and what it returns.
class Step {
 public:
  Step(const RendezvousSettings& settings, RoundState& state, RoundTime now)
      : settings_(settings), state_(state), now_(now) {}

  RoundActions take() { return std::move(out_); }

  void on(const RoundEvent& e) {
    switch (e.kind) {
      case RoundEvent::Kind::kJoin:
        if (!fixed()) {
          print("cpprun: this agent hosts the c10d rendezvous at " + settings_.endpoint() + " (--rdzv_id=" +
                settings_.run_id + ", " + settings_.nnodes_flag() + ")");
        }
        state_.backoff = RestartBackoff(settings_.restart_backoff);
        begin_gathering(e.since);
        return wake();
      case RoundEvent::Kind::kWake:
        return wake();
      case RoundEvent::Kind::kHello:
        return admit(e.peer, *e.message);
      case RoundEvent::Kind::kMessage:
        return heard(e.id, *e.message);
      case RoundEvent::Kind::kLinkLost:
        return lose(e.id, e.why);
      case RoundEvent::Kind::kStoreOpened:
        return start_round(e.store_address, e.store_port);
      case RoundEvent::Kind::kStoreFailed:
        // The members are told why, or they would see only this agent's link close.
        broadcast(NodeMessage::make_exit(e.end), true);
        return finish_with(RoundAction::Kind::kFail, e.end);
      case RoundEvent::Kind::kKeeperEnded:
        // While workers of the round may still use the store, the job ends (Note [Workers' store]);
        // not once every node's workers are done: the job is finishing.
        if (state_.phase != RoundPhase::kRunning) return;
        if (state_.self_done && state_.all_members(MemberProgress::kDone)) return;
        return end_round(RoundEnd::kFatal, e.end);
      case RoundEvent::Kind::kOwnDone:
        state_.self_done = true;
        return;
      case RoundEvent::Kind::kOwnFailed:  // not restartable: a worker stuck in D state (workers/attempt.h)
        return end_round(e.end.restartable ? RoundEnd::kWorkerFailed : RoundEnd::kFatal, e.end);
      case RoundEvent::Kind::kOwnInterrupted:
        if (!state_.end) state_.end = e.end;
        return broadcast(NodeMessage::make_exit(e.end), true);
      case RoundEvent::Kind::kOwnAttemptOver:
        state_.own_over = true;
        return;
      case RoundEvent::Kind::kSignal:
        return end_job(signalled(e.signal));
    }
  }

 private:
  void add(RoundAction a) { out_.actions.push_back(std::move(a)); }
  void print(std::string line) {
    RoundAction a;
    a.line = std::move(line);
    add(std::move(a));
  }
  void send(int id, NodeMessage message) {
    RoundAction a;
    a.kind = RoundAction::Kind::kSend;
    a.id = id;
    a.message = std::move(message);
    add(std::move(a));
  }
  void broadcast(NodeMessage message, bool to_queued) {
    RoundAction a;
    a.kind = RoundAction::Kind::kBroadcast;
    a.message = std::move(message);
    a.to_queued = to_queued;
    add(std::move(a));
  }
  void of_node(RoundAction::Kind kind, int id) {
    RoundAction a;
    a.kind = kind;
    a.id = id;
    add(std::move(a));
  }
  void finish_with(RoundAction::Kind kind, JobEnd end = {}) {
    RoundAction a;
    a.kind = kind;
    a.end = std::move(end);
    add(std::move(a));
  }

  bool fixed() const { return settings_.fixed_ranks(); }

  // How the members and the console name this agent.
  std::string title() const {
    return fixed() ? describe_agent(0, "") : "the agent hosting the rendezvous at " + settings_.endpoint();
  }

  // A job-ending signal while the host waited: before the job started (join()) or after.
  JobEnd signalled(int signal) const {
    if (state_.round == 0 && state_.phase == RoundPhase::kGathering) {
      return {128 + signal, false,
              "cpprun: " + title() + " received " + signal_name(signal) + " before the job started"};
    }
    return {128 + signal, false, title() + " received " + signal_name(signal)};
  }

  // static: the node ranks not here yet. c10d: none, nodes have no rank before their round.
  std::vector<int> missing() const {
    std::vector<int> ranks;
    if (!fixed()) return ranks;
    for (int node = 1; node < settings_.max_nodes; ++node) {
      if (std::none_of(state_.members.begin(), state_.members.end(),
                       [&](const RoundMember& m) { return m.node_rank == node; })) {
        ranks.push_back(node);
      }
    }
    return ranks;
  }

  std::string join_timeout_text() const {
    if (!fixed()) {
      return join_timeout_message(settings_, {}, {}, state_.count(), " (--rdzv_id=" + settings_.run_id + ")");
    }
    // Names the nodes that never came, and apart from them those that came and left again.
    std::vector<int> never;
    std::vector<int> left;
    for (int node : missing()) (state_.ever_joined.count(node) != 0 ? left : never).push_back(node);
    return join_timeout_message(settings_, never, left, state_.count(), "");
  }

  // After a node joined or left while gathering: torchrun's last call opens when the MIN-th node
  // arrives and closes if the nodes drop below MIN again. Every member hears the count.
  void count_changed() {
    const bool was_open = state_.last_call.has_value();
    state_.last_call = last_call_after(settings_, state_.count(), state_.last_call, now_);
    const int count = state_.count();
    if (state_.last_call && !was_open) {
      print("cpprun: " + std::to_string(count) + " node" + (count == 1 ? "" : "s") + " (" + settings_.nnodes_flag() +
            ") at " + settings_.endpoint() + "; starting round " + std::to_string(state_.round) + " in " +
            seconds_text(settings_.last_call_timeout) + " unless more join (--rdzv_conf last_call_timeout)");
    }
    broadcast(NodeMessage::make_gathering(state_.round, count, missing()), false);
  }

  // A round is gathered: the nodes still here, then the queued ones in arrival order, then any that
  // arrive, until MAX are here or MIN and the last call passed (wake()).
  void begin_gathering(RoundTime since) {
    state_.phase = RoundPhase::kGathering;
    for (RoundMember& m : state_.members) {
      m.progress = MemberProgress::kJoined;
      m.group_rank = -1;  // numbered again when the round starts
    }
    while (!state_.queued.empty() && state_.count() < settings_.max_nodes) {
      state_.members.push_back(std::move(state_.queued.front()));  // still kJoined: a queued node has no news
      state_.queued.erase(state_.queued.begin());
    }
    state_.last_call.reset();
    count_changed();
    state_.join_deadline = since + settings_.join_timeout;
  }

  // Carries out decide_admission(): see admission.h.
  void admit(const std::string& peer, const NodeMessage& message) {
    const Admission admission = decide_admission(settings_, state_, message);
    if (admission.kind == Admission::Kind::kRefuse) {
      print("cpprun: warning: refused the agent at " + peer + ": " + admission.reason);
      RoundAction refuse;
      refuse.kind = RoundAction::Kind::kRefuse;
      refuse.message =
          NodeMessage::make_exit({2, false, "cpprun: " + title() + " refused this agent: " + admission.reason});
      return add(std::move(refuse));
    }
    RoundMember node{message.hello.node_rank, peer, MemberProgress::kJoined, message.hello.shape, state_.next_id++, -1};
    of_node(RoundAction::Kind::kAdmit, node.id);
    if (admission.kind == Admission::Kind::kJoin) {
      // static: members stay ordered by --node_rank, the order they are told their ranks in.
      auto at = state_.members.end();
      if (fixed()) {
        state_.ever_joined.insert(node.node_rank);
        at = std::find_if(state_.members.begin(), state_.members.end(),
                          [&](const RoundMember& m) { return m.node_rank > node.node_rank; });
      }
      state_.members.insert(at, std::move(node));
      return count_changed();
    }
    send(node.id, NodeMessage::make_queued(state_.round, state_.count(), admission.taken_in));
    const std::string who = "the agent at " + peer;
    state_.queued.push_back(std::move(node));
    if (admission.ends_round) {
      print("cpprun: " + who + " joined the running job; ending round " + std::to_string(state_.round) +
            " to take it in");
      end_round(RoundEnd::kNodeJoined,
                {1, true,
                 "a new node (" + who + ") joined the job at " + settings_.endpoint() +
                     "; restarting every node's workers to take it in (a membership change: not counted against "
                     "--max_restarts)"});
    } else if (!admission.taken_in) {
      print("cpprun: " + who + " joined; it waits for a next round (" + admission.reason + ")");
    }
  }

  // Members send nothing but these once joined; news of an earlier round is stale, and anything else
  // (an `ask`: only the host asks) is ignored.
  void heard(int id, const NodeMessage& message) {
    const auto node = std::find_if(state_.members.begin(), state_.members.end(),
                                   [&](const RoundMember& m) { return m.id == id; });
    // A member of the job that got a job-ending signal while the next round was gathered (it sends
    // its last round's number): the job ends on every node, as at any other time. It was dropped,
    // the member left alone, and the others went on without it.
    if (state_.phase == RoundPhase::kGathering && state_.round > 0 && node != state_.members.end() &&
        message.kind == MessageKind::kFailed && !message.end.restartable) {
      if (!state_.gathering_ended) state_.gathering_ended = message.end;
      return;
    }
    if (message.round != state_.round || state_.phase != RoundPhase::kRunning) return;
    if (node == state_.members.end()) return;  // a queued node has no news
    if (message.kind == MessageKind::kDone) node->progress = MemberProgress::kDone;
    if (message.kind == MessageKind::kStopped) node->progress = MemberProgress::kStopped;
    if (message.kind == MessageKind::kEvidence) of_node(RoundAction::Kind::kKeepEvidence, id);
    if (message.kind == MessageKind::kFailed) {
      end_round(message.end.restartable ? RoundEnd::kWorkerFailed : RoundEnd::kFatal, message.end);
    }
  }

  // The first end is told to every member; the strongest decides. See RoundEnd.
  void end_round(RoundEnd why, const JobEnd& end) {
    if (outranks(why, state_.why)) {
      state_.why = why;
      state_.decisive = end;
    }
    if (state_.end) return;
    state_.end = end;
    broadcast(NodeMessage::make_end(state_.round, end), false);
  }

  // Node `id`'s link ended (or it missed the stop deadline): it leaves the job.
  void lose(int id, const std::string& why) {
    const auto is = [&](const RoundMember& m) { return m.id == id; };
    if (const auto q = std::find_if(state_.queued.begin(), state_.queued.end(), is); q != state_.queued.end()) {
      const RoundMember node = std::move(*q);
      state_.queued.erase(q);
      of_node(RoundAction::Kind::kDrop, id);
      return print("cpprun: warning: " + describe_member(node) + " left before it got into a round");
    }
    const auto m = std::find_if(state_.members.begin(), state_.members.end(), is);
    if (m == state_.members.end()) return;  // gone already
    const RoundMember node = std::move(*m);
    state_.members.erase(m);
    of_node(RoundAction::Kind::kDrop, id);
    const std::string who = describe_member(node);
    const Loss loss = decide_loss(state_, node.progress);
    if (loss == Loss::kBeforeRound) {
      // A node of a job that has run, lost while the next round is gathered, is lost as between
      // rounds: below MIN the job ends at once (it waited out the join timeout, then blamed too
      // few nodes joining).
      if (state_.round > 0) {
        const NextRound next = launcher::next_round(
            settings_, state_, who + " " + why + " while round " + std::to_string(state_.round) + " was gathered");
        if (!next.goes_on) {
          if (!state_.gathering_ended) state_.gathering_ended = JobEnd{1, false, next.reason};
          return;
        }
      }
      print("cpprun: warning: " + who + " left before round " + std::to_string(state_.round) + " started" +
            (fixed() ? "; waiting for a node " + std::to_string(node.node_rank) + " again" : ""));
      return count_changed();
    }
    if (node.group_rank >= 0) {  // Note [One diagnosis for several nodes]
      RoundAction gone;
      gone.kind = RoundAction::Kind::kNodeGone;
      gone.group_rank = node.group_rank;
      gone.line = why;
      add(std::move(gone));
    }
    if (loss == Loss::kLetGo) return print("cpprun: warning: " + who + " " + why + " after its workers succeeded");
    end_round(RoundEnd::kNodeLost, {1, false, who + " " + why});
  }

  // The round's store keeper listens: every member gets its group rank, in the state's order
  // (round_plan.h), and the host's own workers start.
  void start_round(const std::string& store_address, int store_port) {
    state_.phase = RoundPhase::kRunning;
    state_.attempt_started = now_;
    state_.end.reset();
    state_.why = RoundEnd::kNone;
    state_.self_done = false;
    state_.own_over = false;
    state_.late_checked = false;
    state_.held.reset();
    state_.last_call.reset();
    state_.stop_deadline.reset();
    state_.restart_at.reset();
    // Opted out of the agents' store (one node only): nothing to tunnel, worker rank 0 hosts it.
    const bool tunnelled = !settings_.job_secret.empty() && settings_.agent_store;
    RoundPlan plan = plan_round(settings_, state_, store_port, tunnelled ? store_address : "");
    for (std::size_t i = 0; i < state_.members.size(); ++i) {
      RoundMember& m = state_.members[i];
      m.group_rank = plan.starts[i].layout.group_rank;
      m.progress = MemberProgress::kRunning;
      if (tunnelled) {
        RoundAction serve;
        serve.kind = RoundAction::Kind::kServeStore;
        serve.id = m.id;
        serve.round = state_.round;
        serve.store_address = store_address;
        serve.store_port = store_port;
        add(std::move(serve));
      }
      send(m.id, std::move(plan.starts[i]));
    }
    for (const RoundMember& q : state_.queued) send(q.id, plan.queued);
    for (std::string& line : plan.lines) print(std::move(line));
    RoundAction run;
    run.kind = RoundAction::Kind::kRunRound;
    run.round = state_.round;
    run.layout = plan.own;
    run.slices = std::move(plan.slices);
    add(std::move(run));
  }

  void end_job(const JobEnd& end) {
    of_node(RoundAction::Kind::kStopStore, 0);
    broadcast(NodeMessage::make_exit(end), true);
    finish_with(RoundAction::Kind::kEndJob, end);
  }

  // The clock, or news: gathering, whether the round starts; once the host's own attempt is over,
  // what follows it. Nothing while the host's workers run.
  void wake() {
    if (state_.phase == RoundPhase::kGathering && state_.gathering_ended) {
      return end_job(*std::exchange(state_.gathering_ended, std::nullopt));
    }
    if (state_.phase == RoundPhase::kGathering) return gather();
    if (state_.own_over) follow_attempt();
  }

  void gather() {
    const GatherStep step = gather_step(settings_, state_.count(), state_.last_call, state_.join_deadline, now_);
    if (step.kind == GatherStep::Kind::kStart) return of_node(RoundAction::Kind::kOpenStore, 0);
    if (step.kind == GatherStep::Kind::kTimedOut) {
      const std::string message = join_timeout_text();
      broadcast(NodeMessage::make_exit({1, false, message}), true);
      return finish_with(RoundAction::Kind::kFail, {1, false, message});
    }
    out_.wake_at = step.until;
  }

  // This node's workers had all succeeded, another node's failed: the host's attempt reported
  // nothing, so the others' evidence is collected now, once a round (Note [One diagnosis for
  // several nodes]); `next` is carried out after it, whatever came meanwhile.
  bool collect_late(AfterAttempt next) {
    if (!state_.self_done || !state_.end || state_.late_checked) return false;
    state_.late_checked = true;
    state_.held = next;
    of_node(RoundAction::Kind::kCollectLate, 0);
    return true;
  }

  void follow_attempt() {
    for (;;) {
      const AfterAttempt next =
          state_.held ? *std::exchange(state_.held, std::nullopt) : after_attempt(settings_, state_);
      switch (next) {
        case AfterAttempt::kWait:
          return;
        case AfterAttempt::kFinish:
          of_node(RoundAction::Kind::kStopStore, 0);  // every node's workers are done: nothing needs the store
          broadcast(NodeMessage::make_exit({0, false, ""}), true);
          return finish_with(RoundAction::Kind::kFinish);
        case AfterAttempt::kEndJob:
          if (!collect_late(next)) end_job(state_.decisive);
          return;
        case AfterAttempt::kChange:
          if (!collect_late(next)) next_round();
          return;
        case AfterAttempt::kRestart:
          if (!collect_late(next)) restart();
          return;
        case AfterAttempt::kAwaitStopped:
          if (!state_.stop_deadline) {
            state_.stop_deadline = now_ + settings_.shutdown_timeout + kStopSlack;
          } else if (now_ >= *state_.stop_deadline) {
            lose_unstopped();
            continue;
          }
          out_.wake_at = state_.stop_deadline;
          return;
      }
    }
  }

  // The stop deadline passed: every node that has not reported its workers stopped is lost.
  void lose_unstopped() {
    for (std::size_t i = state_.members.size(); i-- > 0;) {
      if (state_.members[i].progress != MemberProgress::kStopped) {
        lose(state_.members[i].id, "did not report its workers stopped within --shutdown_timeout + " +
                                       std::to_string(kStopSlack.count()) + " s");
      }
    }
  }

  // The backoff before every node's restart, decided once a round (and printed unless 0): the next
  // round starts when it is due.
  void restart() {
    if (!state_.restart_at) {
      const auto ran = std::chrono::duration_cast<std::chrono::milliseconds>(now_ - state_.attempt_started);
      const std::chrono::milliseconds delay = state_.backoff.after_failure(ran);
      state_.restart_at = now_ + delay;
      if (delay.count() > 0) {
        print(restart_wait_line(settings_.restart_backoff, delay, state_.restart_count + 1, settings_.max_restarts));
      }
    }
    if (now_ >= *state_.restart_at) return next_round();
    out_.wake_at = state_.restart_at;
  }

  // Every remaining node has stopped its workers: gather the next round, or end the job.
  void next_round() {
    const NextRound next = launcher::next_round(settings_, state_, state_.decisive.reason);
    if (!next.goes_on) return end_job({1, false, next.reason});
    if (next.counts_restart) ++state_.restart_count;
    // Every node's workers are stopped: the round's channels go before any new worker starts, and the
    // round's store with its keeper.
    RoundAction close;
    close.kind = RoundAction::Kind::kEndStoreRound;
    close.round = state_.round;
    add(std::move(close));
    ++state_.round;
    begin_gathering(now_);
    gather();
  }

  const RendezvousSettings& settings_;
  RoundState& state_;
  const RoundTime now_;
  RoundActions out_;
};

}  // namespace

RoundEvent RoundEvent::join(RoundTime since) {
  RoundEvent e;
  e.kind = Kind::kJoin;
  e.since = since;
  return e;
}

RoundEvent RoundEvent::wake() { return RoundEvent{}; }

RoundEvent RoundEvent::hello(std::string peer, const NodeMessage& message) {
  RoundEvent e;
  e.kind = Kind::kHello;
  e.peer = std::move(peer);
  e.message = &message;
  return e;
}

RoundEvent RoundEvent::said(int id, const NodeMessage& message) {
  RoundEvent e;
  e.kind = Kind::kMessage;
  e.id = id;
  e.message = &message;
  return e;
}

RoundEvent RoundEvent::link_lost(int id, std::string why) {
  RoundEvent e;
  e.kind = Kind::kLinkLost;
  e.id = id;
  e.why = std::move(why);
  return e;
}

RoundEvent RoundEvent::store_opened(std::string address, int port) {
  RoundEvent e;
  e.kind = Kind::kStoreOpened;
  e.store_address = std::move(address);
  e.store_port = port;
  return e;
}

RoundEvent RoundEvent::of(Kind kind, JobEnd end) {
  RoundEvent e;
  e.kind = kind;
  e.end = std::move(end);
  return e;
}

RoundEvent RoundEvent::signalled(int signal) {
  RoundEvent e;
  e.kind = Kind::kSignal;
  e.signal = signal;
  return e;
}

RoundActions decide_round(const RendezvousSettings& settings, RoundState& state, const RoundEvent& event,
                          RoundTime now) {
  Step step(settings, state, now);
  step.on(event);
  return step.take();
}

std::optional<std::vector<int>> evidence_askees(const RoundState& state) {
  if (state.phase != RoundPhase::kRunning || state.ending() || state.members.empty()) return std::nullopt;
  std::vector<int> ids;
  for (const RoundMember& m : state.members) {
    if (m.progress == MemberProgress::kRunning) ids.push_back(m.id);  // a done node has nothing to add
  }
  return ids;
}

std::string describe_member(const RoundMember& member) {
  const int rank = member.group_rank >= 0 ? member.group_rank : member.node_rank;  // static: known from hello
  return rank >= 0 ? describe_agent(rank, member.peer) : "the agent at " + member.peer;
}

}  // namespace cpprun::launcher
