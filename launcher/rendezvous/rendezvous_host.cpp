// The rendezvous's host, static (node 0) or c10d: gathers each round's nodes, numbers them, relays
// every node's news, and decides restarts, membership changes and the job's end (Note [Elastic rounds]).
// Admission (admission.h), the MIN:MAX window (round_window.h), what each node is told when a round
// starts (round_plan.h), and what follows a round or a loss (round_outcome.h) are decided by pure
// rules on a RoundState (round_state.h); this class carries their decisions out: it sends, prints,
// paces restarts, ends rounds. It forwards the evidence for a diagnosis across nodes to an
// EvidenceCollector (evidence_collector.h) and waits on its links for it. It starts and stops each
// round's store keeper (Note [Workers' store] in node_rendezvous.h).
#include <poll.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <memory>
#include <optional>
#include <set>
#include <system_error>
#include <utility>
#include <vector>

#include "rendezvous/admission.h"
#include "rendezvous/evidence_collector.h"
#include "rendezvous/node_link.h"
#include "rendezvous/node_rendezvous.h"
#include "rendezvous/round_outcome.h"
#include "rendezvous/round_plan.h"
#include "rendezvous/round_state.h"
#include "rendezvous/round_window.h"
#include "rendezvous/store_tunnel_io.h"
#include "workers/restart_backoff.h"
#include "workers/store_keeper.h"

namespace cpprun::launcher {
namespace {

// Past --shutdown_timeout, how long a node may take to report its workers stopped before it is lost.
constexpr std::chrono::seconds kStopSlack{30};

class RendezvousHost final : public NodeRendezvous {
 public:
  RendezvousHost(const RendezvousSettings& settings, const KeeperSettings& keeper, LinkListener listener,
                 Clock::time_point started)
      : settings_(settings), keeper_settings_(keeper), started_(started), listener_(std::move(listener)) {}

  std::optional<RankLayout> join(SignalRelay& relay, int& signal) override {
    if (!settings_.fixed_ranks()) {
      std::cerr << "cpprun: this agent hosts the c10d rendezvous at " << settings_.endpoint() << " (--rdzv_id="
                << settings_.run_id << ", " << settings_.nnodes_flag() << ")\n";
    }
    std::optional<RankLayout> layout = gather(relay, started_);
    if (!layout) {
      signal = pending_signal_;
      end_job({128 + signal, false,
               "cpprun: " + title() + " received " + signal_name(signal) + " before the job started"});
    }
    return layout;
  }

  int round() const override { return round_; }
  int restart_count() const override { return restart_count_; }
  bool attempt_ended() const override { return end_.has_value(); }
  const JobEnd& peer_end() const override { return *end_; }

  std::vector<std::string> link_addresses() const override {
    std::vector<std::string> addresses;
    for (const Node& n : nodes_) addresses.push_back(n.link.local_address());
    return addresses;
  }

  // The last messages (`exit` above all) reach the members before this agent exits: Note [The link's
  // outbound queue].
  ~RendezvousHost() override {
    std::vector<NodeLink*> links;
    for (Node& n : nodes_) links.push_back(&n.link);
    for (Node& n : queued_) links.push_back(&n.link);
    flush_links(links, kFinalFlushTimeout);
  }

  std::vector<pollfd> poll_fds() const override {
    std::vector<pollfd> fds;
    for (const Node& n : nodes_) fds.push_back(n.link.poll_entry());
    for (const Node& n : queued_) fds.push_back(n.link.poll_entry());
    for (const Node& n : nodes_) n.tunnel->add_poll_fds(n.link, fds);  // a queued node has no workers
    for (const pollfd& fd : pending_.poll_fds()) fds.push_back(fd);
    fds.push_back({listener_.fd(), POLLIN, 0});
    if (keeper_ && keeper_->poll_entry().fd >= 0) fds.push_back(keeper_->poll_entry());
    return fds;
  }

  void on_ready(int fd, short revents) override {
    if (keeper_ && keeper_->owns(fd)) return keeper_ended();
    if (fd == listener_.fd()) {
      pending_.accept_from(listener_);
      while (auto introduced = pending_.take_introduced()) admit(std::move(introduced->first), introduced->second);
      return;
    }
    for (std::size_t i = 0; i < nodes_.size(); ++i) {
      if (!nodes_[i].tunnel->owns(fd)) continue;
      if (const std::string why = nodes_[i].tunnel->on_ready(fd, revents, nodes_[i].link); !why.empty()) {
        lose(i, why);
      }
      return;
    }
    if (auto introduced = pending_.read(fd)) return admit(std::move(introduced->first), introduced->second);
    // A link that flush() finds gone, or ended on a bound, is read at once: receive() reports its end.
    const bool read = (revents & ~POLLOUT) != 0;
    for (std::size_t i = 0; i < nodes_.size(); ++i) {
      if (nodes_[i].link.fd() != fd) continue;
      if (!nodes_[i].link.flush() || read) read_node(i);
      return;
    }
    for (std::size_t i = 0; i < queued_.size(); ++i) {
      if (queued_[i].link.fd() != fd) continue;
      if (!queued_[i].link.flush() || read) read_queued(i);
      return;
    }
  }

  void report_done() override {
    self_done_ = true;
    evidence_.own_done();  // Note [One diagnosis for several nodes]
  }
  void report_failed(const JobEnd& end) override { end_round(RoundEnd::kWorkerFailed, end); }
  void report_interrupted(const JobEnd& end) override {
    if (!end_) end_ = end;
    broadcast_all(NodeMessage::make_exit(end));
  }

  bool share_evidence(const std::vector<RankEvidence>& evidence) override {
    evidence_.own_evidence(evidence);
    return true;
  }

  std::optional<MergedEvidence> collect_evidence(SignalRelay& relay, std::chrono::milliseconds wait) override {
    const auto started = Clock::now();
    const auto deadline = started + wait;
    while (evidence_.failure_awaited(done_nodes()) && Clock::now() < deadline) {
      if (const int signal = poll_links(relay, ms_until(deadline)); signal != 0) {
        raise(signal);  // for decide(): the job ends
        break;
      }
    }
    const auto waited = std::min<std::chrono::milliseconds>(
        wait, std::chrono::ceil<std::chrono::milliseconds>(Clock::now() - started));
    return evidence_.merge_failure(waited);
  }

  std::optional<LateEvidence> take_late_evidence() override { return std::exchange(late_evidence_, std::nullopt); }

  // Note [Diagnosis on request across nodes]: the running round's other nodes are asked; a new
  // request replaces an open one, whose late answers are then set aside by number.
  int ask_nodes_for_evidence() override {
    if (phase_ != RoundPhase::kRunning || end_ || nodes_.empty()) return 0;
    const int request = evidence_.open_request();
    for (Node& n : nodes_) {
      if (n.state == MemberProgress::kRunning) n.link.send(NodeMessage::make_ask(round_, request));
    }
    return request;
  }

  bool evidence_owed(int request) override { return evidence_.request_awaited(request, done_nodes()); }

  MergedEvidence close_evidence_request(int request, std::vector<RankEvidence> own,
                                        std::chrono::milliseconds waited) override {
    return evidence_.close_request(request, std::move(own), done_nodes(), waited);
  }

  JobDecision decide(SignalRelay& relay) override {
    // News that arrived while this node's workers were being stopped (a lost node, say) counts.
    if (poll_once(relay, 0)) return interrupted();
    std::optional<Clock::time_point> stop_deadline;
    for (;;) {
      switch (after_attempt(settings_, round_state())) {
        case AfterAttempt::kWait:
          break;
        case AfterAttempt::kFinish:
          keeper_.reset();  // every node's workers are done: nothing needs the store
          broadcast_all(NodeMessage::make_exit({0, false, ""}));
          return {JobDecision::Kind::kFinish, {}, {}};
        case AfterAttempt::kEndJob:
          keep_late_evidence(relay);
          return end_job(decisive_);
        case AfterAttempt::kChange:
          keep_late_evidence(relay);
          return start_next_round(relay);
        case AfterAttempt::kRestart:
          keep_late_evidence(relay);
          // The backoff before every node's restart; the links are polled until it is due.
          stop_deadline = pacer_.restart_at(restart_count_ + 1, settings_.max_restarts);
          if (Clock::now() >= *stop_deadline) return start_next_round(relay);
          break;
        case AfterAttempt::kAwaitStopped:
          if (!stop_deadline) {
            stop_deadline = Clock::now() + settings_.shutdown_timeout + kStopSlack;
          } else if (Clock::now() >= *stop_deadline) {
            for (std::size_t i = nodes_.size(); i-- > 0;) {
              if (nodes_[i].state != MemberProgress::kStopped) {
                lose(i, "did not report its workers stopped within --shutdown_timeout + " +
                            std::to_string(kStopSlack.count()) + " s");
              }
            }
            continue;
          }
          break;
      }
      if (poll_once(relay, stop_deadline ? ms_until(*stop_deadline) : -1)) return interrupted();
    }
  }

 private:
  struct Node {
    NodeLink link;
    NodeHello hello;
    MemberProgress state = MemberProgress::kJoined;
    int group_rank = -1;  // in the running round; -1 before it got one
    // The workers' store's channels on this link (Note [Store tunnel wired]); movable with the Node.
    std::unique_ptr<StoreTunnel> tunnel = std::make_unique<StoreTunnel>(LinkSide::kHost);
  };

  bool tunnelled() const { return !settings_.job_secret.empty(); }

  // The members whose workers had all succeeded this round, by group rank: they have no evidence to send.
  std::vector<int> done_nodes() const {
    std::vector<int> done;
    for (const Node& n : nodes_) {
      if (n.state == MemberProgress::kDone && n.group_rank >= 0) done.push_back(n.group_rank);
    }
    return done;
  }

  int count() const { return 1 + static_cast<int>(nodes_.size()); }  // this node too

  // How the members and the console name this agent.
  std::string title() const {
    if (settings_.fixed_ranks()) return describe_agent(0, "");
    return "the agent hosting the rendezvous at " + settings_.endpoint();
  }

  static std::string describe(const Node& node) {
    const int rank = node.group_rank >= 0 ? node.group_rank : node.hello.node_rank;  // static: known from hello
    return rank >= 0 ? describe_agent(rank, node.link.peer()) : "the agent at " + node.link.peer();
  }

  // Gathers a round: the nodes still here, then the queued ones in arrival order, then any that
  // arrive, until MAX are here or MIN and the last call passed. nullopt: a job-ending signal came.
  std::optional<RankLayout> gather(SignalRelay& relay, Clock::time_point since) {
    phase_ = RoundPhase::kGathering;
    for (Node& n : nodes_) {
      n.state = MemberProgress::kJoined;
      n.group_rank = -1;  // numbered again when the round starts
    }
    while (!queued_.empty() && count() < settings_.max_nodes) {
      nodes_.push_back(std::move(queued_.front()));  // still kJoined: a queued node has no news
      queued_.erase(queued_.begin());
    }
    last_call_.reset();
    count_changed();
    const auto deadline = since + settings_.join_timeout;
    for (;;) {
      const GatherStep step = gather_step(settings_, count(), last_call_, deadline, Clock::now());
      if (step.kind == GatherStep::Kind::kStart) return start_round(relay);
      if (step.kind == GatherStep::Kind::kTimedOut) {
        const std::string message = join_timeout_message();
        broadcast_all(NodeMessage::make_exit({1, false, message}));
        throw RendezvousError(message, 1);
      }
      if (poll_once(relay, ms_until(step.until))) return std::nullopt;
    }
  }

  // After a node joined or left while gathering: torchrun's last call opens when the MIN-th node
  // arrives and closes if the nodes drop below MIN again.
  void count_changed() {
    const bool was_open = last_call_.has_value();
    last_call_ = last_call_after(settings_, count(), last_call_, Clock::now());
    if (last_call_ && !was_open) {
      std::cerr << "cpprun: " << count() << " node" << (count() == 1 ? "" : "s") << " (" << settings_.nnodes_flag()
                << ") at " << settings_.endpoint() << "; starting round " << round_ << " in "
                << seconds_text(settings_.last_call_timeout) << " unless more join (--rdzv_conf last_call_timeout)\n";
    }
    for (Node& n : nodes_) n.link.send(NodeMessage::make_gathering(round_, count(), missing()));
  }

  // static: the node ranks not here yet. c10d: none, nodes have no rank before their round.
  std::vector<int> missing() const {
    std::vector<int> ranks;
    if (!settings_.fixed_ranks()) return ranks;
    for (int node = 1; node < settings_.max_nodes; ++node) {
      if (!slot(node)) ranks.push_back(node);
    }
    return ranks;
  }

  const Node* slot(int node_rank) const {
    const auto it = std::find_if(nodes_.begin(), nodes_.end(),
                                 [&](const Node& n) { return n.hello.node_rank == node_rank; });
    return it == nodes_.end() ? nullptr : &*it;
  }

  std::string join_timeout_message() const {
    if (!settings_.fixed_ranks()) {
      return launcher::join_timeout_message(settings_, {}, {}, count(), " (--rdzv_id=" + settings_.run_id + ")");
    }
    // Names the nodes that never came, and apart from them those that came and left again.
    std::vector<int> never;
    std::vector<int> left;
    for (int node : missing()) (ever_joined_.count(node) != 0 ? left : never).push_back(node);
    return launcher::join_timeout_message(settings_, never, left, count(), "");
  }

  RankLayout start_round(const SignalRelay& relay) {
    phase_ = RoundPhase::kRunning;
    pacer_.attempt_started();
    end_.reset();
    why_ = RoundEnd::kNone;
    self_done_ = false;
    last_call_.reset();
    // The round's store keeper, on a new socket at a port the kernel picks (--master_port is where the
    // agents meet): Note [Workers' store]. With a job secret on the loopback alone (Note [Store tunnel
    // wired]); without one the other nodes' workers connect to it at this host's address.
    const StoreSocketPlan socket = plan_store_socket(tunnelled() ? StoreReach::kLoopback : StoreReach::kEveryInterface,
                                                     loopback_family_for(settings_.host) == LoopbackFamily::kIpv6, 0);
    try {
      keeper_ = std::make_unique<StoreKeeper>(keeper_settings_, socket, "", relay, "node 0");
    } catch (const StoreKeeperError& e) {
      // The members are told why, or they would see only this agent's link close.
      broadcast_all(NodeMessage::make_exit({e.exit_code(), false, e.what()}));
      throw RendezvousError(e.what(), e.exit_code());
    }
    const LoopbackEndpoint store{tunnelled() ? keeper_->address() : "", keeper_->port()};
    // The round was gathered: every member gets its group rank, in the host's order (round_plan.h).
    const RoundPlan plan = plan_round(settings_, round_state(), store.port, store.address);
    evidence_.start_round(round_, plan.slices);
    late_checked_ = false;
    for (std::size_t i = 0; i < nodes_.size(); ++i) {
      nodes_[i].group_rank = plan.starts[i].layout.group_rank;
      nodes_[i].state = MemberProgress::kRunning;
      if (tunnelled()) nodes_[i].tunnel->serve_round(round_, store, nodes_[i].link);
      nodes_[i].link.send(plan.starts[i]);
    }
    for (Node& n : queued_) n.link.send(plan.queued);
    for (const std::string& line : plan.lines) std::cerr << line << "\n";
    return plan.own;
  }

  // Every remaining node has stopped its workers: gather the next round, or end the job.
  JobDecision start_next_round(SignalRelay& relay) {
    const NextRound next = next_round(settings_, round_state(), decisive_.reason);
    if (!next.goes_on) return end_job({1, false, next.reason});
    if (next.counts_restart) ++restart_count_;
    // Every node's workers are stopped: the round's channels go before any new worker starts, and the
    // round's store with its keeper.
    for (Node& n : nodes_) n.tunnel->end_round(round_, n.link);
    keeper_.reset();
    ++round_;
    std::optional<RankLayout> layout = gather(relay, Clock::now());
    if (!layout) return interrupted();
    return {JobDecision::Kind::kRestart, *layout, {}};
  }

  JobDecision interrupted() {
    return end_job({128 + pending_signal_, false, title() + " received " + signal_name(pending_signal_)});
  }

  JobDecision end_job(const JobEnd& end) {
    keeper_.reset();
    broadcast_all(NodeMessage::make_exit(end));
    return {JobDecision::Kind::kExit, {}, end};
  }

  void broadcast_all(const NodeMessage& message) {
    for (Node& n : nodes_) n.link.send(message);
    for (Node& n : queued_) n.link.send(message);
  }

  // The first end is told to every node; the strongest decides. See RoundEnd.
  void end_round(RoundEnd why, const JobEnd& end) {
    if (outranks(why, why_)) {
      why_ = why;
      decisive_ = end;
    }
    if (end_) return;
    end_ = end;
    for (Node& n : nodes_) n.link.send(NodeMessage::make_end(round_, end));
  }

  void lose(std::size_t i, const std::string& why) {
    Node node = std::move(nodes_[i]);
    nodes_.erase(nodes_.begin() + static_cast<long>(i));
    const std::string who = describe(node);
    const Loss loss = decide_loss(round_state(), node.state);
    if (loss == Loss::kBeforeRound) {
      std::cerr << "cpprun: warning: " << who << " left before round " << round_ << " started"
                << (settings_.fixed_ranks() ? "; waiting for a node " + std::to_string(node.hello.node_rank) + " again"
                                            : "")
                << "\n";
      count_changed();
      return;
    }
    if (node.group_rank >= 0) evidence_.node_gone(node.group_rank, why);  // Note [One diagnosis for several nodes]
    if (loss == Loss::kLetGo) {
      std::cerr << "cpprun: warning: " << who << " " << why << " after its workers succeeded\n";
      return;
    }
    end_round(RoundEnd::kNodeLost, {1, false, who + " " + why});
  }

  // The round's keeper ended (its watch said so): while workers of the round may still use the store,
  // the job ends, naming it (Note [Workers' store]).
  void keeper_ended() {
    const std::optional<std::string> how = keeper_->check_ended();
    if (!how || phase_ != RoundPhase::kRunning) return;
    const RoundState state = round_state();
    if (state.self_done && state.all_members(MemberProgress::kDone)) return;  // the job is finishing
    end_round(RoundEnd::kFatal, {1, false, keeper_ended_reason(keeper_->description(), *how)});
  }

  // Returns true when a job-ending signal arrived (in pending_signal_).
  bool poll_once(SignalRelay& relay, int timeout_ms) {
    pending_signal_ = poll_links(relay, timeout_ms);
    return pending_signal_ != 0;
  }

  // The round as the rules see it (round_state.h).
  RoundState round_state() const {
    RoundState state;
    state.phase = phase_;
    state.round = round_;
    state.restart_count = restart_count_;
    for (const Node& n : nodes_) state.members.push_back({n.hello.node_rank, n.link.peer(), n.state, n.hello.shape});
    for (const Node& n : queued_) state.queued.push_back({n.hello.node_rank, n.link.peer(), n.state, n.hello.shape});
    state.end = end_;
    state.why = why_;
    state.self_done = self_done_;
    return state;
  }

  // Carries out decide_admission(): see admission.h.
  void admit(NodeLink link, const NodeMessage& message) {
    const Admission admission = decide_admission(settings_, round_state(), message);
    if (admission.kind == Admission::Kind::kRefuse) {
      std::cerr << "cpprun: warning: refused the agent at " << link.peer() << ": " << admission.reason << "\n";
      link.send(NodeMessage::make_exit({2, false, "cpprun: " + title() + " refused this agent: " + admission.reason}));
      flush_links({&link}, kFinalFlushTimeout);  // then the link closes
      return;
    }
    Node node{std::move(link), message.hello, MemberProgress::kJoined, -1};
    if (admission.kind == Admission::Kind::kJoin) {
      // static: nodes_ stays ordered by --node_rank, the order they are told their ranks in.
      const auto at = std::find_if(nodes_.begin(), nodes_.end(),
                                   [&](const Node& n) { return n.hello.node_rank > node.hello.node_rank; });
      if (settings_.fixed_ranks()) ever_joined_.insert(node.hello.node_rank);
      nodes_.insert(settings_.fixed_ranks() ? at : nodes_.end(), std::move(node));
      count_changed();
      return;
    }
    node.link.send(NodeMessage::make_queued(round_, count(), admission.taken_in));
    const std::string who = "the agent at " + node.link.peer();
    queued_.push_back(std::move(node));
    if (admission.ends_round) {
      std::cerr << "cpprun: " << who << " joined the running job; ending round " << round_ << " to take it in\n";
      end_round(RoundEnd::kNodeJoined,
                {1, true,
                 "a new node (" + who + ") joined the job at " + settings_.endpoint() +
                     "; restarting every node's workers to take it in (a membership change: not counted against "
                     "--max_restarts)"});
    } else if (!admission.taken_in) {
      std::cerr << "cpprun: " << who << " joined; it waits for a next round (" << admission.reason << ")\n";
    }
  }

  void read_node(std::size_t i) {
    NodeLink::Received got = nodes_[i].link.receive();
    for (const NodeMessage& message : got.messages) {
      if (!is_tunnel_kind(message.kind)) {
        handle(nodes_[i], message);
        continue;
      }
      if (const std::string why = nodes_[i].tunnel->on_peer(message, nodes_[i].link); !why.empty()) {
        nodes_[i].link.close();
        return lose(i, why);
      }
    }
    if (got.closed) nodes_[i].tunnel->on_link_lost();
    // A violation or a stalled queue closes it too.
    if (got.closed) lose(i, !got.violation.empty() ? got.violation : !got.stalled.empty() ? got.stalled : kAgentGone);
  }

  void read_queued(std::size_t i) {
    NodeLink::Received got = queued_[i].link.receive();  // a queued node says nothing until its round
    if (got.closed) {
      std::cerr << "cpprun: warning: " << describe(queued_[i]) << " left before it got into a round\n";
      queued_.erase(queued_.begin() + static_cast<long>(i));
    }
  }

  // Members send nothing but these once joined; news of an earlier round is stale, and anything else
  // (an `ask`: only the host asks) is ignored.
  void handle(Node& node, const NodeMessage& message) {
    if (message.round != round_ || phase_ != RoundPhase::kRunning) return;
    if (message.kind == MessageKind::kDone) node.state = MemberProgress::kDone;
    if (message.kind == MessageKind::kStopped) node.state = MemberProgress::kStopped;
    if (message.kind == MessageKind::kEvidence) {
      evidence_.receive({node.group_rank, node.hello.shape.local_world_size, describe(node)}, message);
    }
    if (message.kind == MessageKind::kFailed) {
      end_round(message.end.restartable ? RoundEnd::kWorkerFailed : RoundEnd::kFatal, message.end);
    }
  }

  // This node's workers had all succeeded, another node's failed: run_attempt reported nothing here,
  // so the others' evidence is collected now, once per round (Note [One diagnosis for several nodes]).
  void keep_late_evidence(SignalRelay& relay) {
    if (!self_done_ || !end_ || late_checked_) return;
    late_checked_ = true;
    // The members send theirs as soon as the round ends; nodes that are done or gone are not waited for.
    std::optional<MergedEvidence> merged = collect_evidence(relay, kEvidenceWait);
    late_evidence_ = LateEvidence{std::move(*merged), end_->reason};
  }

  const RendezvousSettings settings_;
  const KeeperSettings keeper_settings_;
  std::unique_ptr<StoreKeeper> keeper_;  // the running round's (Note [Workers' store])
  const Clock::time_point started_;
  LinkListener listener_;
  PendingLinks pending_;             // connected, not introduced yet
  std::vector<Node> nodes_;          // this round's other nodes: in join order (c10d), by --node_rank (static)
  std::vector<Node> queued_;         // arrived while a round ran, in arrival order
  std::set<int> ever_joined_;        // static: node ranks that joined, for the join time-out's message
  RoundPhase phase_ = RoundPhase::kGathering;
  int round_ = 0;
  int restart_count_ = 0;
  std::optional<JobEnd> end_;  // why the attempt ended
  std::optional<Clock::time_point> last_call_;
  RoundEnd why_ = RoundEnd::kNone;
  JobEnd decisive_;  // the end that decides: see RoundEnd
  bool self_done_ = false;
  int pending_signal_ = 0;
  RestartPacer pacer_{settings_.restart_backoff};  // the backoff before every node's restart
  EvidenceCollector evidence_;          // the round's, for a diagnosis across nodes
  bool late_checked_ = false;           // keep_late_evidence() ran this round
  std::optional<LateEvidence> late_evidence_;
};

}  // namespace

std::unique_ptr<NodeRendezvous> make_rendezvous_host(const RendezvousSettings& settings, const KeeperSettings& keeper,
                                                     LinkListener listener, Clock::time_point started) {
  return std::make_unique<RendezvousHost>(settings, keeper, std::move(listener), started);
}

}  // namespace cpprun::launcher
