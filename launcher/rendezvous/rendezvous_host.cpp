// The rendezvous's host, static (node 0) or c10d: the executor of its pure step (round_decide.h), as
// torchelastic's dynamic rendezvous executes what its handlers decide. It polls its links, its
// listener and the round's store keeper, turns what it hears into RoundEvents, and carries out the
// RoundActions decide_round returns, in order: it admits and drops links, sends, prints, starts and
// stops the round's store keeper and the members' tunnels (Note [Workers' store] in
// node_rendezvous.h), and forwards the evidence for a diagnosis across nodes to an EvidenceCollector
// (evidence_collector.h), waiting on its links for it. It holds no rule of the rendezvous (who is
// admitted, when a round starts, what follows a failure or a loss): those are decide_round's, on the
// one RoundState kept here (Note [The host's state and its links] in round_state.h).
#include <poll.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "command_line/host_facts.h"
#include "rendezvous/evidence_collector.h"
#include "rendezvous/node_link.h"
#include "rendezvous/node_rendezvous.h"
#include "rendezvous/round_decide.h"
#include "rendezvous/round_state.h"
#include "rendezvous/store_tunnel_io.h"
#include "workers/store_keeper.h"

namespace cpprun::launcher {
namespace {

class RendezvousHost final : public NodeRendezvous {
 public:
  RendezvousHost(const RendezvousSettings& settings, const KeeperSettings& keeper, LinkListener listener,
                 Clock::time_point started)
      : settings_(settings), keeper_settings_(keeper), started_(started), listener_(std::move(listener)) {}

  std::optional<RankLayout> join(SignalRelay& relay, int& signal) override {
    const RoundAction last = wait(relay, RoundEvent::join(started_));
    if (last.kind == RoundAction::Kind::kRunRound) return last.layout;
    signal = signal_;  // the job ended on it before it started
    return std::nullopt;
  }

  int round() const override { return state_.round; }
  int restart_count() const override { return state_.restart_count; }
  bool attempt_ended() const override { return state_.ending(); }
  const JobEnd& peer_end() const override { return *state_.end; }

  std::vector<std::string> link_addresses() const override {
    std::vector<std::string> addresses;
    for (const RoundMember& m : state_.members) addresses.push_back(io(m.id).link.local_address());
    return addresses;
  }

  // The last messages (`exit` above all) reach the members before this agent exits: Note [The link's
  // outbound queue].
  ~RendezvousHost() override {
    std::vector<NodeLink*> links;
    for (const std::vector<RoundMember>* nodes : {&state_.members, &state_.queued}) {
      for (const RoundMember& m : *nodes) links.push_back(&io(m.id).link);
    }
    flush_links(links, kFinalFlushTimeout);
  }

  std::vector<pollfd> poll_fds() const override {
    std::vector<pollfd> fds;
    for (const RoundMember& m : state_.members) fds.push_back(io(m.id).link.poll_entry());
    for (const RoundMember& m : state_.queued) fds.push_back(io(m.id).link.poll_entry());
    for (const RoundMember& m : state_.members) {  // a queued node has no workers
      const NodeIO& node = io(m.id);
      node.tunnel->add_poll_fds(node.link, fds);
    }
    for (const pollfd& fd : pending_.poll_fds()) fds.push_back(fd);
    fds.push_back({listener_.fd(), POLLIN, 0});
    if (keeper_ && keeper_->poll_entry().fd >= 0) fds.push_back(keeper_->poll_entry());
    return fds;
  }

  void on_ready(int fd, short revents) override {
    if (keeper_ && keeper_->owns(fd)) return keeper_ended();
    if (fd == listener_.fd()) {
      pending_.accept_from(listener_);
      while (auto introduced = pending_.take_introduced()) heard_hello(std::move(*introduced));
      return;
    }
    for (const RoundMember& m : state_.members) {
      NodeIO& node = io(m.id);
      if (!node.tunnel->owns(fd)) continue;
      if (const std::string why = node.tunnel->on_ready(fd, revents, node.link); !why.empty()) lost(m.id, why);
      return;
    }
    if (auto introduced = pending_.read(fd)) return heard_hello(std::move(*introduced));
    // A link that flush() finds gone, or ended on a bound, is read at once: receive() reports its end.
    const bool read = (revents & ~POLLOUT) != 0;
    for (const RoundMember& m : state_.members) {
      NodeLink& link = io(m.id).link;
      if (link.fd() != fd) continue;
      if (!link.flush() || read) read_member(m.id);
      return;
    }
    for (const RoundMember& m : state_.queued) {
      NodeLink& link = io(m.id).link;
      if (link.fd() != fd) continue;
      if (!link.flush() || read) read_queued(m.id);
      return;
    }
  }

  void report_done() override {
    evidence_.own_done();  // Note [One diagnosis for several nodes]
    carry_out(step(RoundEvent::of(RoundEvent::Kind::kOwnDone)));
  }
  void report_failed(const JobEnd& end) override { carry_out(step(RoundEvent::of(RoundEvent::Kind::kOwnFailed, end))); }
  void report_interrupted(const JobEnd& end) override {
    carry_out(step(RoundEvent::of(RoundEvent::Kind::kOwnInterrupted, end)));
  }

  bool share_evidence(const std::vector<RankEvidence>& evidence) override {
    evidence_.own_evidence(evidence);
    return true;
  }

  std::optional<MergedEvidence> collect_evidence(SignalRelay& relay, std::chrono::milliseconds wait) override {
    const auto started = Clock::now();
    const auto deadline = started + wait;
    while (evidence_.failure_awaited(state_.done_group_ranks()) && Clock::now() < deadline) {
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

  // Note [Diagnosis on request across nodes]: the members evidence_askees() names are asked; a new
  // request replaces an open one, whose late answers are then set aside by number.
  int ask_nodes_for_evidence() override {
    const std::optional<std::vector<int>> asked = evidence_askees(state_);
    if (!asked) return 0;
    const int request = evidence_.open_request();
    for (int id : *asked) io(id).link.send(NodeMessage::make_ask(state_.round, request));
    return request;
  }

  bool evidence_owed(int request) override { return evidence_.request_awaited(request, state_.done_group_ranks()); }

  MergedEvidence close_evidence_request(int request, std::vector<RankEvidence> own,
                                        std::chrono::milliseconds waited) override {
    return evidence_.close_request(request, std::move(own), state_.done_group_ranks(), waited);
  }

  JobDecision decide(SignalRelay& relay) override {
    carry_out(step(RoundEvent::of(RoundEvent::Kind::kOwnAttemptOver)));
    // News that arrived while this node's workers were being stopped (a lost node, say) counts.
    const RoundAction last = wait(relay, polled(relay, 0));
    switch (last.kind) {
      case RoundAction::Kind::kRunRound:
        return {JobDecision::Kind::kRestart, last.layout, {}};
      case RoundAction::Kind::kFinish:
        return {JobDecision::Kind::kFinish, {}, {}};
      default:
        return {JobDecision::Kind::kExit, {}, last.end};
    }
  }

 private:
  // A node's I/O, beside its RoundMember in the state, by the same id.
  struct NodeIO {
    NodeLink link;
    // The workers' store's channels on this link (Note [Store tunnel wired]).
    std::unique_ptr<StoreTunnel> tunnel;
  };

  // What a step's event came with: the link a hello came on (for kAdmit, kRefuse), the message a
  // member said (for kKeepEvidence).
  struct Heard {
    std::optional<NodeLink> link;
    const NodeMessage* message;  // no initializer: GCC then refuses carry_out's `Heard heard = {}` (which zeroes it)
  };

  bool tunnelled() const { return !settings_.job_secret.empty(); }

  NodeIO& io(int id) { return links_.at(id); }
  const NodeIO& io(int id) const { return links_.at(id); }

  RoundActions step(const RoundEvent& event) { return decide_round(settings_, state_, event, Clock::now()); }

  // Steps from `event` until an action ends the wait (RoundAction::ends_wait), carrying out every
  // action on the way and polling the links until the step's wake_at, or news.
  RoundAction wait(SignalRelay& relay, RoundEvent event) {
    for (;;) {
      const RoundActions actions = step(event);
      if (std::optional<RoundAction> last = carry_out(actions, &relay)) return *last;
      // kCollectLate polled the links while it collected: what was decided before it follows at once.
      const bool collected =
          !actions.actions.empty() && actions.actions.back().kind == RoundAction::Kind::kCollectLate;
      event = collected ? RoundEvent::wake() : polled(relay, actions.wake_at ? ms_until(*actions.wake_at) : -1);
    }
  }

  // Waits up to timeout_ms for news, carried out as it comes (on_ready); then the clock's turn, or the signal's.
  RoundEvent polled(SignalRelay& relay, int timeout_ms) {
    signal_ = poll_links(relay, timeout_ms);
    return signal_ != 0 ? RoundEvent::signalled(signal_) : RoundEvent::wake();
  }

  // Only a step on kJoin or kWake opens a store or collects evidence late (a round starts, or the
  // attempt is followed up, in round_decide's wake()), and those are stepped inside wait(), which
  // has the relay; an event stepped from on_ready or report_*() carries no relay. Should a change
  // to the rules break that, this names it instead of dereferencing null.
  static SignalRelay& needs_relay(SignalRelay* relay, const char* action) {
    if (relay == nullptr) {
      throw std::logic_error(std::string("rendezvous host: ") + action +
                             " decided outside join() or decide(), where no signal relay is at hand");
    }
    return *relay;
  }

  // Carries the actions out in order; returns the one that ends the wait, if any. `relay`: for the
  // store keeper and the late evidence, which only a wait's steps (join(), decide()) ask for.
  std::optional<RoundAction> carry_out(const RoundActions& actions, SignalRelay* relay = nullptr, Heard heard = {}) {
    for (const RoundAction& a : actions.actions) {
      switch (a.kind) {
        case RoundAction::Kind::kAdmit: {
          // Admitted at its hello, which said how many workers it runs: its tunnel's cap.
          const RoundMember* member = state_.find(a.id);
          const int workers = member != nullptr ? member->shape.local_world_size : 0;
          links_.emplace(a.id, NodeIO{std::move(*heard.link),
                                      std::make_unique<StoreTunnel>(LinkSide::kHost, tunnel_channel_cap(workers))});
          heard.link.reset();
          break;
        }
        case RoundAction::Kind::kRefuse:
          heard.link->send(a.message);
          flush_links({&*heard.link}, kFinalFlushTimeout);  // then the link closes
          break;
        case RoundAction::Kind::kDrop:
          links_.erase(a.id);
          break;
        case RoundAction::Kind::kSend:
          io(a.id).link.send(a.message);
          break;
        case RoundAction::Kind::kBroadcast:
          for (const RoundMember& m : state_.members) io(m.id).link.send(a.message);
          if (a.to_queued) {
            for (const RoundMember& m : state_.queued) io(m.id).link.send(a.message);
          }
          break;
        case RoundAction::Kind::kPrint:
          std::cerr << a.line << "\n";
          break;
        case RoundAction::Kind::kNodeGone:
          evidence_.node_gone(a.group_rank, a.line);  // Note [One diagnosis for several nodes]
          break;
        case RoundAction::Kind::kKeepEvidence: {
          const RoundMember& m = *state_.find(a.id);
          evidence_.receive({m.group_rank, m.shape.local_world_size, describe_member(m)}, *heard.message);
          break;
        }
        case RoundAction::Kind::kOpenStore:
          return carry_out(step(open_store(needs_relay(relay, "kOpenStore"))), relay);
        case RoundAction::Kind::kServeStore: {
          NodeIO& node = io(a.id);
          node.tunnel->serve_round(a.round, {a.store_address, a.store_port}, node.link);
          break;
        }
        case RoundAction::Kind::kEndStoreRound:
          // Every node's workers are stopped: the round's channels go before any new worker starts,
          // and the round's store with its keeper.
          for (const RoundMember& m : state_.members) {
            NodeIO& node = io(m.id);
            node.tunnel->end_round(a.round, node.link);
          }
          keeper_.reset();
          break;
        case RoundAction::Kind::kStopStore:
          keeper_.reset();
          break;
        case RoundAction::Kind::kCollectLate: {
          // The members send theirs as soon as the round ends; nodes that are done or gone are not waited for.
          std::optional<MergedEvidence> merged = collect_evidence(needs_relay(relay, "kCollectLate"), kEvidenceWait);
          late_evidence_ = LateEvidence{std::move(*merged), state_.end->reason};
          break;
        }
        case RoundAction::Kind::kRunRound:
          evidence_.start_round(a.round, a.slices);
          return a;
        case RoundAction::Kind::kFinish:
        case RoundAction::Kind::kEndJob:
          return a;
        case RoundAction::Kind::kFail:
          throw job_end_error(a.end);
      }
    }
    return std::nullopt;
  }

  // The round's store keeper, on a new socket at a port the kernel picks (--master_port is where the
  // agents meet): Note [Workers' store]. With a job secret on the loopback alone (Note [Store tunnel
  // wired]); without one the other nodes' workers connect to it at this host's address.
  RoundEvent open_store(SignalRelay& relay) {
    // Opted out (Note [Opting out of the agent's store] in launch_config.cpp): no keeper; worker rank 0
    // hosts the store at a port free here, as torchrun's RendezvousStoreInfo.build picks one.
    if (!settings_.agent_store) return RoundEvent::store_opened("", pick_free_port());
    const StoreSocketPlan socket = plan_store_socket(tunnelled() ? StoreReach::kLoopback : StoreReach::kEveryInterface,
                                                     loopback_family_for(settings_.host) == LoopbackFamily::kIpv6, 0);
    try {
      keeper_ = std::make_unique<StoreKeeper>(keeper_settings_, socket, "", relay, "node 0");
    } catch (const StoreKeeperError& e) {
      return RoundEvent::of(RoundEvent::Kind::kStoreFailed, {e.exit_code(), false, e.what()});
    }
    return RoundEvent::store_opened(keeper_->address(), keeper_->port());
  }

  // The round's keeper ended (its watch said so): the step decides whether that ends the job.
  void keeper_ended() {
    const std::optional<std::string> how = keeper_->check_ended();
    if (!how) return;
    carry_out(step(RoundEvent::of(RoundEvent::Kind::kKeeperEnded,
                                  {1, false, keeper_ended_reason(keeper_->description(), *how)})));
  }

  void heard_hello(std::pair<NodeLink, NodeMessage> introduced) {
    const RoundEvent event = RoundEvent::hello(introduced.first.peer(), introduced.second);
    carry_out(step(event), nullptr, Heard{std::move(introduced.first), nullptr});
  }

  void lost(int id, const std::string& why) { carry_out(step(RoundEvent::link_lost(id, why))); }

  void read_member(int id) {
    NodeIO& node = io(id);  // only kLinkLost drops it
    NodeLink::Received got = node.link.receive();
    for (const NodeMessage& message : got.messages) {
      if (!is_tunnel_kind(message.kind)) {
        carry_out(step(RoundEvent::said(id, message)), nullptr, Heard{std::nullopt, &message});
        continue;
      }
      if (const std::string why = node.tunnel->on_peer(message, node.link); !why.empty()) {
        node.link.close();
        return lost(id, why);
      }
    }
    if (!got.closed) return;
    node.tunnel->on_link_lost();
    // A violation or a stalled queue closes it too.
    lost(id, !got.violation.empty() ? got.violation : !got.stalled.empty() ? got.stalled : kAgentGone);
  }

  void read_queued(int id) {
    // A queued node says nothing until its round.
    if (io(id).link.receive().closed) lost(id, kAgentGone);
  }

  const RendezvousSettings settings_;
  const KeeperSettings keeper_settings_;
  std::unique_ptr<StoreKeeper> keeper_;  // the running round's (Note [Workers' store])
  const Clock::time_point started_;
  LinkListener listener_;
  PendingLinks pending_;         // connected, not introduced yet
  RoundState state_;             // decide_round's: Note [The host's state and its links]
  std::map<int, NodeIO> links_;  // each member's and queued node's, by RoundMember::id
  int signal_ = 0;        // the job-ending signal the last poll returned
  EvidenceCollector evidence_;  // the round's, for a diagnosis across nodes
  std::optional<LateEvidence> late_evidence_;
};

}  // namespace

std::unique_ptr<NodeRendezvous> make_rendezvous_host(const RendezvousSettings& settings, const KeeperSettings& keeper,
                                                     LinkListener listener, Clock::time_point started) {
  return std::make_unique<RendezvousHost>(settings, keeper, std::move(listener), started);
}

}  // namespace cpprun::launcher
