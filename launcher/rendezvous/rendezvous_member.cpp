// A member's side of the rendezvous, static or c10d: connected to the host's agent (see
// node_rendezvous.cpp), reports this node's news and follows the host's decisions.
#include <poll.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <optional>
#include <system_error>
#include <utility>
#include <vector>

#include "rendezvous/node_link.h"
#include "rendezvous/node_rendezvous.h"
#include "rendezvous/store_tunnel_io.h"

namespace cpprun::launcher {
namespace {

// Once linked to the host, how long past its own join timeout a member waits for the host's
// verdict, which names the missing nodes best (the host's clock started about when this one's did).
constexpr std::chrono::seconds kVerdictGrace{3};
// The host answers a hello at once; silence this long means the port is something else's.
constexpr std::chrono::seconds kFirstWordTimeout{10};

class RendezvousMember final : public NodeRendezvous {
 public:
  RendezvousMember(const RendezvousSettings& settings, NodeLink link, Clock::time_point started, Reconnect reconnect)
      : settings_(settings), started_(started), link_(std::move(link)), reconnect_(std::move(reconnect)),
        host_title_(settings.fixed_ranks() ? describe_agent(0, link_.peer())
                                           : "the agent hosting the c10d rendezvous at " + settings.endpoint() + " (" +
                                                 link_.peer() + ")") {}

  int round() const override { return round_; }
  int restart_count() const override { return restart_count_; }
  bool attempt_ended() const override { return end_.has_value(); }
  const JobEnd& peer_end() const override { return *end_; }

  std::optional<RankLayout> join(SignalRelay& relay, int& signal) override {
    const auto deadline = started_ + settings_.join_timeout;
    const NodeHello hello{kNodeProtocolVersion, backend_name(settings_.backend), settings_.node_rank,
                          settings_.min_nodes, settings_.max_nodes, settings_.max_restarts, settings_.run_id,
                          settings_.shape};
    link_.send(NodeMessage::make_hello(hello));
    auto connected = Clock::now();

    for (;;) {
      if (dropped_early_) {  // See Note [Pending links under a flood]
        dropped_early_ = false;
        ++retries_;
        if (retries_ == 1) {
          std::cerr << "cpprun: " << host_title_ << " " << drop_reason_ << "; trying again until the join timeout ("
                    << seconds_text(settings_.join_timeout) << ")\n";
        }
        std::optional<NodeLink> again;
        std::string error;
        // Not at once: what closes every connection unanswered would be connected to as fast as the
        // network allows for the whole join timeout, and a host busy with a flood would get more of it.
        const int pause = static_cast<int>(retry_pause(retries_ - 1).count());
        if ((signal = poll_links(relay, std::min(ms_until(deadline), pause))) != 0) return std::nullopt;
        while (!again && Clock::now() < deadline) {
          again = reconnect_(deadline, error);
          if (!again && (signal = poll_links(relay, std::min(ms_until(deadline), 200))) != 0) return std::nullopt;
        }
        if (!again) throw dropped_too_often(error);
        link_ = std::move(*again);
        tunnel_.on_new_link();  // the old link's loss left its tunnel closed for good
        heard_ = false;
        link_.send(NodeMessage::make_hello(hello));
        connected = Clock::now();
      }
      if (start_) {
        const RankLayout layout = take_start();
        std::cerr << "cpprun: joined the " << hello.backend << " rendezvous at " << settings_.endpoint()
                  << " (--rdzv_id=" << settings_.run_id << "): round " << round_ << ", node " << layout.group_rank
                  << " of " << layout.group_world_size << ", "
                  << rank_range(layout.base_rank, settings_.shape.local_world_size)
                  << " of WORLD_SIZE=" << layout.world_size << "\n";
        return layout;
      }
      if (decision_) throw verdict_before_start();
      if (!heard_ && Clock::now() >= connected + kFirstWordTimeout) {
        throw RendezvousError(silent_host_message(kFirstWordTimeout), 1);
      }
      const int left = ms_until(deadline + kVerdictGrace);
      if (left <= 0) {
        // A host that never spoke (no challenge, no `busy`, no message on any link) has reported
        // nothing the timeout's message could name.
        throw RendezvousError(heard_ || host_spoke_ ? timeout_message()
                                     : silent_host_message(std::chrono::duration_cast<std::chrono::seconds>(
                                           Clock::now() - connected)),
                              1);
      }
      if ((signal = poll_links(relay, heard_ ? left : std::min(left, 1000))) != 0) return std::nullopt;
    }
  }

  std::vector<std::string> link_addresses() const override { return {link_.local_address()}; }

  // The last message (`failed`, `stopped`) reaches the host before this agent exits: Note [The link's
  // outbound queue].
  ~RendezvousMember() override { flush_links({&link_}, kFinalFlushTimeout); }

  std::vector<pollfd> poll_fds() const override {
    if (link_.fd() < 0) return {};
    std::vector<pollfd> fds{link_.poll_entry()};
    tunnel_.add_poll_fds(link_, fds);
    return fds;
  }

  // A link that flush() finds gone, or ended on a bound, is read at once: receive() reports its end.
  void on_ready(int fd, short revents) override {
    if (tunnel_.owns(fd)) {
      tunnel_violation(tunnel_.on_ready(fd, revents, link_));
      return;
    }
    if (fd != link_.fd()) return;  // a channel's socket closed during this dispatch
    if (link_.flush() && (revents & ~POLLOUT) == 0) return;
    const bool was_open = link_.authenticated();
    NodeLink::Received got = link_.receive();
    for (const NodeMessage& message : got.messages) {
      if (!is_tunnel_kind(message.kind)) {
        handle(message);
      } else if (tunnel_violation(tunnel_.on_peer(message, link_))) {
        return;
      }
    }
    if (link_.heard_host()) host_spoke_ = true;
    if (got.closed) tunnel_.on_link_lost();
    // Dropped before the handshake completed, by a host too busy to keep it, or closed unanswered:
    // join() tries again (Note [Pending links under a flood]). A refusal of the secret is final.
    if (got.closed && !was_open && !link_.authenticated() && got.messages.empty() && got.refused.empty() &&
        got.violation.empty() && !decision_ && !start_ && reconnect_) {
      dropped_early_ = true;
      drop_reason_ = got.busy ? "dropped this node's connection before the handshake: it was busy with too many "
                                "unproven connections"
                              : "closed this node's connection before the handshake completed";
      return;
    }
    if (got.closed && !decision_) {
      std::string why = !got.refused.empty()     ? got.refused
                        : !got.violation.empty() ? got.violation
                        : !got.stalled.empty()   ? got.stalled
                                                 : kAgentGone;
      // See Note [Elastic rounds]: the rendezvous lives in the host's agent. A refusal (another job
      // secret) is this agent's alone: the job goes on without it.
      if (got.refused.empty()) {
        why += "; the job cannot go on without the agent that hosts its " +
               std::string(backend_name(settings_.backend)) + " rendezvous";
      }
      const JobEnd lost{1, false, host_title_ + " " + why};
      if (!end_) end_ = lost;
      decision_ = JobDecision{JobDecision::Kind::kExit, {}, lost};
    }
  }

  void report_done() override {
    self_done_ = true;
    link_.send(NodeMessage::make_done(round_));
  }
  void report_failed(const JobEnd& end) override { link_.send(NodeMessage::make_failed(round_, end)); }
  void report_interrupted(const JobEnd& end) override { link_.send(NodeMessage::make_failed(round_, end)); }

  bool share_evidence(const std::vector<RankEvidence>& evidence) override {
    // Ended by the host's `exit` (its agent got a signal): the host diagnoses nothing, so this node does.
    if (ended_by_exit_) return false;
    bool sent = link_.fd() >= 0;
    for (const RankEvidence& e : evidence) sent = link_.send(NodeMessage::make_evidence(round_, e)) && sent;
    return sent && link_.fd() >= 0;
  }

  std::optional<MergedEvidence> collect_evidence(SignalRelay&, std::chrono::milliseconds) override {
    return std::nullopt;  // node 0 diagnoses
  }

  // Note [Diagnosis on request across nodes]: asked here, this node answers for its own ranks.
  std::string partial_answer_note() const override {
    return "cpprun: (node " + std::to_string(group_rank_) + "'s ranks only: for every rank of the job, run cpprun "
           "--diagnose with the pid of node 0's cpprun, the agent hosting the rendezvous at " + settings_.endpoint() +
           ")\n";
  }
  int take_evidence_request() override { return std::exchange(asked_, 0); }
  void answer_evidence_request(int request, const std::vector<RankEvidence>& evidence) override {
    for (const RankEvidence& e : evidence) link_.send(NodeMessage::make_evidence(round_, e, request));
  }

  JobDecision decide(SignalRelay& relay) override {
    // Node 0 restarts once every node's workers are stopped; done ones count once the round ended.
    if (!self_done_ || end_) send_stopped();
    for (;;) {
      if (decision_) return *std::exchange(decision_, std::nullopt);
      if (start_) return {JobDecision::Kind::kRestart, take_start(), {}};
      if (const int signal = poll_links(relay, -1); signal != 0) {
        JobEnd end{128 + signal, false, describe_agent(group_rank_, "") + " received " + signal_name(signal)};
        link_.send(NodeMessage::make_failed(round_, end));
        return {JobDecision::Kind::kExit, {}, end};
      }
    }
  }

 private:
  // What answered at the endpoint accepted this node's connection and has said nothing for `waited`.
  std::string silent_host_message(std::chrono::seconds waited) const {
    return "cpprun: " + link_.peer() + ", reached through " + settings_.endpoint() +
           ", accepted a connection but did not answer as a cpprun rendezvous host within " + seconds_text(waited) +
           ": is another program (or another job's store) using that port? Pick another port for every node.";
  }

  // The host is silent past the join timeout (c10d: it only enforces the timeout while gathering).
  std::string timeout_message() const {
    if (settings_.fixed_ranks()) return join_timeout_message(settings_, missing_, {}, 0, " (as node 0 last reported)");
    if (!queued_) return join_timeout_message(settings_, {}, {}, status_nodes_, " (as its host last reported)");
    return "cpprun: this node waited " + seconds_text(settings_.join_timeout) +
           " (--rdzv_conf join_timeout) for a place in the job at " + settings_.endpoint() + ", which runs round " +
           std::to_string(status_round_) + " on " + std::to_string(status_nodes_) + " nodes (" +
           settings_.nnodes_flag() + ") and took it in no new round. Raise --rdzv_conf join_timeout=SECONDS to wait "
           "longer.";
  }

  // The host said `exit` before this node got into a round: refused, failed, or finished without it;
  // or the link ended before that (another secret, not an agent's words).
  RendezvousError verdict_before_start() const {
    const JobEnd& end = decision_->end;
    if (end.exit_code == 0) {
      return RendezvousError("cpprun: the job at " + settings_.endpoint() + " (--rdzv_id=" + settings_.run_id +
                                 ") finished before this node got into a round; nothing ran here",
                             0);
    }
    return job_end_error(end);
  }

  // Every link to the host closed before the handshake until the join timeout (Note [Pending links
  // under a flood]). `error`: why the last connect failed, if it did. A host that ever sent its
  // challenge, or said it was busy, is a cpprun agent, and something crowds it; what never said a
  // word of cpprun's protocol is not one, or not this job's.
  RendezvousError dropped_too_often(const std::string& error) const {
    if (host_spoke_) {
      return RendezvousError("cpprun: " + host_title_ + " " + drop_reason_ + ", " + std::to_string(retries_) +
                                 " time" + (retries_ == 1 ? "" : "s") + " within the join timeout (" +
                                 seconds_text(settings_.join_timeout) + ")" + (error.empty() ? "" : "; " + error) +
                                 ". Something may be flooding node 0's agent with connections: find it (ss -tn "
                                 "on node 0 lists them), or raise --rdzv_conf join_timeout=SECONDS.",
                             1);
    }
    const std::string flags = settings_.fixed_ranks() ? "--master_addr, --master_port" : "--rdzv_endpoint";
    const std::string last = error.empty() ? "" : "; the last try: " + error;
    return RendezvousError("cpprun: what listens at " + settings_.endpoint() + " (" + flags +
                               ") closed every one of this node's connections before the handshake, without a word "
                               "of cpprun's protocol (" + std::to_string(retries_) + " within the join timeout of " +
                               seconds_text(settings_.join_timeout) + last +
                               "): it may not be a cpprun agent, or it is another job's port. Find what listens there "
                               "(ss -ltnp on that host), or pick a free port for every node.",
                           1);
  }

  // The host broke the tunnel's rules: the link is closed and the job cannot go on. False for "".
  bool tunnel_violation(const std::string& why) {
    if (why.empty()) return false;
    link_.close();
    tunnel_.on_link_lost();
    const JobEnd lost{1, false, host_title_ + " " + why + "; the job cannot go on without it"};
    if (!end_) end_ = lost;
    decision_ = JobDecision{JobDecision::Kind::kExit, {}, lost};
    return true;
  }

  RankLayout take_start() {
    RankLayout layout = start_->layout;
    if (layout.store_tunnelled) listen_for_workers(start_->round, layout);
    round_ = start_->round;
    restart_count_ = start_->restart_count;
    start_.reset();
    end_.reset();
    queued_ = false;
    self_done_ = false;
    stopped_sent_ = false;
    ended_by_exit_ = false;
    asked_ = 0;
    group_rank_ = layout.group_rank;
    return layout;
  }

  // Before this round's workers start: this node's listener for them, and their MASTER_ADDR and
  // MASTER_PORT (Note [Store tunnel wired]). The host's port first, so that MASTER_PORT is the same on
  // every node, unless the host agent is on this machine, where that port is the store keeper's.
  void listen_for_workers(int round, RankLayout& layout) {
    const std::string local = link_.local_address();
    const bool host_here = !local.empty() && local == peer_source(link_.peer());
    const int host_port = layout.master_port;
    try {
      const LoopbackEndpoint at =
          tunnel_.listen_for_round(round, loopback_family_for(settings_.host), host_here ? 0 : host_port, link_);
      layout.master_addr = at.address;
      layout.master_port = at.port;
    } catch (const std::system_error& e) {
      throw RendezvousError(std::string("cpprun: cannot listen on this node's loopback for its workers' store "
                                        "connections (round ") +
                                std::to_string(round) + "): " + e.what(),
                            1);
    }
    if (layout.master_port != host_port && !host_here) {
      std::cerr << "cpprun: MASTER_PORT=" << host_port << " is taken on this node; its workers reach the store "
                << "through this agent at " << layout.master_addr << ":" << layout.master_port << "\n";
    }
  }

  void send_stopped() {
    if (stopped_sent_) return;
    link_.send(NodeMessage::make_stopped(round_));
    stopped_sent_ = true;
  }

  void handle(const NodeMessage& message) {
    heard_ = true;
    switch (message.kind) {
      case MessageKind::kGathering:
      case MessageKind::kQueued:
        if (message.kind == MessageKind::kQueued && !queued_) {
          std::cerr << "cpprun: the job at " << settings_.endpoint() << " is running round " << message.round << " on "
                    << message.nodes << " node" << (message.nodes == 1 ? "" : "s") << "; this node joins it "
                    << (message.restarting ? "now: that round is being ended to take it in"
                                           : "in its next round, if one starts within --rdzv_conf join_timeout "
                                             "(the job is at --nnodes MAX, or finishing)")
                    << "\n";
        }
        missing_ = message.missing;  // static; a queued node is c10d's
        status_round_ = message.round;
        status_nodes_ = message.nodes;
        queued_ = message.kind == MessageKind::kQueued;
        break;
      case MessageKind::kStart:
        start_ = message;
        break;
      case MessageKind::kEnd:
        if (message.round != round_) break;
        if (!end_) end_ = message.end;
        // Done already: nothing to stop, say so at once. Otherwise decide() says it once stopped.
        if (self_done_) send_stopped();
        break;
      case MessageKind::kAsk:  // answered between the workers' events (run_attempt), if still running
        if (message.round == round_ && !end_) asked_ = message.request;
        break;
      case MessageKind::kExit:
        if (!end_) ended_by_exit_ = true;
        if (!end_) end_ = message.end;
        decision_ = JobDecision{message.end.exit_code == 0 ? JobDecision::Kind::kFinish : JobDecision::Kind::kExit,
                                {}, message.end};
        break;
      default:
        break;  // node 0 sends nothing else
    }
  }

  const RendezvousSettings settings_;
  const Clock::time_point started_;
  NodeLink link_;
  // The workers' store's channels: Note [Store tunnel wired].
  StoreTunnel tunnel_{LinkSide::kMember, tunnel_channel_cap(settings_.shape.local_world_size)};
  const Reconnect reconnect_;
  const std::string host_title_;  // "the agent of node 0 (10.0.0.1:41234)": for messages
  int round_ = 0;
  int restart_count_ = 0;
  std::optional<JobEnd> end_;  // why the attempt ended
  int group_rank_ = -1;
  std::vector<int> missing_;          // static: the node ranks not joined, as node 0 last reported
  bool heard_ = false;                // the host has said something
  bool queued_ = false;               // c10d: a round runs without this node
  int status_round_ = 0;              // the round the host last reported
  int status_nodes_ = 1;              // its nodes, as the host last reported
  std::optional<NodeMessage> start_;  // a round's start, not yet taken
  std::optional<JobDecision> decision_;
  bool self_done_ = false;
  bool stopped_sent_ = false;
  bool ended_by_exit_ = false;  // the round ended with the host's `exit`, no `end` before it
  int asked_ = 0;               // the host's latest `ask` of this round not answered yet
  bool dropped_early_ = false;  // the link closed before the handshake: join() reconnects
  std::string drop_reason_;
  int retries_ = 0;
  bool host_spoke_ = false;  // some link to the host heard its challenge or `busy` (NodeLink::heard_host())
};

}  // namespace

std::unique_ptr<NodeRendezvous> make_rendezvous_member(const RendezvousSettings& settings, NodeLink link,
                                                       Clock::time_point started, Reconnect reconnect) {
  return std::make_unique<RendezvousMember>(settings, std::move(link), started, std::move(reconnect));
}

}  // namespace cpprun::launcher
