// The c10d rendezvous's host: the agent listening at --rdzv_endpoint. Gathers each round's nodes,
// numbers them in the order they joined, relays every node's news to the others, and decides
// restarts, membership changes and the job's end. See Note [Elastic rounds].
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <iostream>
#include <system_error>
#include <vector>

#include "host_facts.h"
#include "node_link.h"
#include "pending_links.h"
#include "node_rendezvous.h"
#include "restart_pacer.h"

namespace cpprun::launcher {
namespace {

using Clock = std::chrono::steady_clock;

// After a round ended, how long the host waits for the other nodes to report their workers stopped,
// beyond --shutdown_timeout, before it counts a silent one as lost.
constexpr std::chrono::seconds kStopSlack{30};

// Why the running round ended. The first reason is what the nodes are told; a stronger one that
// comes later still decides what happens next (a worker failing because a node died is the node's
// loss, not a failure to count against --max_restarts).
enum class RoundEnd {
  kNone,
  kWorkerFailed,  // a restart, counted against --max_restarts
  kNodeJoined,    // a membership change: a node came while the job had room
  kNodeLost,      // a membership change: a node left while its workers ran
  kFatal,         // an agent got a job-ending signal: the job ends
};

int strength(RoundEnd end) {
  switch (end) {
    case RoundEnd::kNone: return 0;
    case RoundEnd::kWorkerFailed:
    case RoundEnd::kNodeJoined: return 1;
    case RoundEnd::kNodeLost: return 2;
    case RoundEnd::kFatal: return 3;
  }
  return 0;
}

class ElasticHost final : public NodeRendezvous {
 public:
  ElasticHost(const LaunchConfig& config, LinkListener listener, Clock::time_point started)
      : config_(config), started_(started), listener_(std::move(listener)) {}

  std::optional<RankLayout> join(SignalRelay& relay, int& signal) override {
    std::cerr << "cpprun: this agent hosts the c10d rendezvous at " << endpoint() << " (--rdzv_id=" << config_.run_id
              << ", --nnodes=" << nnodes_text() << ")\n";
    std::optional<RankLayout> layout = gather(relay, started_);
    if (!layout) {
      signal = pending_signal_;
      broadcast_all(NodeMessage::make_exit({128 + signal, false,
                                            "cpprun: the agent hosting the rendezvous at " + endpoint() +
                                                " received " + signal_name(signal) + " before the job started"}));
    }
    return layout;
  }

  int round() const override { return round_; }
  int restart_count() const override { return restart_count_; }
  const JobEnd& peer_end() const override { return *end_; }

  std::vector<int> fds() const override {
    std::vector<int> fds;
    for (const Node& n : nodes_) fds.push_back(n.link.fd());
    for (const Node& n : queued_) fds.push_back(n.link.fd());
    for (int fd : pending_.fds()) fds.push_back(fd);
    fds.push_back(listener_.fd());
    return fds;
  }

  void on_readable(int fd) override {
    if (fd == listener_.fd()) {
      pending_.accept_from(listener_);
      return;
    }
    if (pending_.owns(fd)) {
      if (auto introduced = pending_.read(fd)) admit(std::move(introduced->first), introduced->second);
      return;
    }
    for (std::size_t i = 0; i < nodes_.size(); ++i) {
      if (nodes_[i].link.fd() == fd) return read_node(i);
    }
    for (std::size_t i = 0; i < queued_.size(); ++i) {
      if (queued_[i].link.fd() == fd) return read_queued(i);
    }
  }

  bool attempt_ended() const override { return end_.has_value(); }

  void report_done() override { self_done_ = true; }

  void report_failed(const JobEnd& end) override { end_round(RoundEnd::kWorkerFailed, end); }

  void report_interrupted(const JobEnd& end) override {
    if (!end_) end_ = end;
    broadcast_all(NodeMessage::make_exit(end));
  }

  JobDecision decide(SignalRelay& relay) override {
    // News that arrived while this node's workers were being stopped (a lost node, say) counts.
    if (poll_once(relay, 0)) return interrupted();
    std::optional<Clock::time_point> stop_deadline;
    for (;;) {
      if (!end_) {
        if (self_done_ && all_nodes(NodeState::kDone)) {
          broadcast_all(NodeMessage::make_exit({0, false, ""}));
          return {JobDecision::Kind::kFinish, {}, {}};
        }
      } else if (why_ == RoundEnd::kFatal ||
                 (why_ == RoundEnd::kWorkerFailed && restart_count_ >= config_.max_restarts)) {
        broadcast_all(NodeMessage::make_exit(decisive_));
        return {JobDecision::Kind::kExit, {}, decisive_};
      } else if (all_nodes(NodeState::kStopped)) {
        // Only restarts after a worker failure back off; the links are polled until it is due.
        if (why_ == RoundEnd::kWorkerFailed) stop_deadline = pacer_.restart_at(restart_count_ + 1, config_.max_restarts);
        if (why_ != RoundEnd::kWorkerFailed || Clock::now() >= *stop_deadline) return next_round(relay);
      } else if (!stop_deadline) {
        stop_deadline = Clock::now() + config_.shutdown_timeout + kStopSlack;
      } else if (Clock::now() >= *stop_deadline) {
        for (std::size_t i = nodes_.size(); i-- > 0;) {
          if (nodes_[i].state != NodeState::kStopped) {
            lose(i, "did not report its workers stopped within --shutdown_timeout + " +
                        std::to_string(kStopSlack.count()) + " s");
          }
        }
        continue;
      }
      int timeout = -1;
      if (stop_deadline) timeout = ms_until(*stop_deadline);
      if (poll_once(relay, timeout)) return interrupted();
    }
  }

 private:
  enum class NodeState {
    kJoined,   // in the round being gathered
    kRunning,  // its workers run this round
    kDone,     // its workers all succeeded this round
    kFailed,   // it reported a failure this round
    kStopped,  // its workers of this round are stopped
    kQueued,   // came while a round ran: joins the next one
  };

  struct Node {
    NodeLink link;
    NodeHello hello;
    NodeState state = NodeState::kJoined;
    int group_rank = -1;  // in the running round; -1 before it got one
  };

  enum class Phase { kGathering, kRunning };

  std::string endpoint() const { return endpoint_text(config_); }
  std::string nnodes_text() const {
    return std::to_string(config_.min_nodes) + ":" + std::to_string(config_.max_nodes);
  }
  int count() const { return 1 + static_cast<int>(nodes_.size()); }  // this node too

  static int ms_until(Clock::time_point when) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(when - Clock::now());
    return static_cast<int>(std::clamp<long long>(left.count(), 0, 1 << 30));
  }

  static std::string describe(const Node& node) {
    return node.group_rank >= 0 ? describe_agent(node.group_rank, node.link.peer())
                                : "the agent at " + node.link.peer();
  }

  // Gathers a round: the nodes still here, then the queued ones in arrival order, then any that
  // arrive, until MAX are here or MIN and the last call passed. nullopt: a job-ending signal came.
  std::optional<RankLayout> gather(SignalRelay& relay, Clock::time_point since) {
    phase_ = Phase::kGathering;
    for (Node& n : nodes_) {
      n.state = NodeState::kJoined;
      n.group_rank = -1;  // numbered again when the round starts
    }
    while (!queued_.empty() && count() < config_.max_nodes) {
      nodes_.push_back(std::move(queued_.front()));
      queued_.erase(queued_.begin());
      nodes_.back().state = NodeState::kJoined;
    }
    last_call_.reset();
    count_changed();
    const auto deadline = since + config_.join_timeout;
    for (;;) {
      const bool enough = count() >= config_.min_nodes;
      if (count() >= config_.max_nodes || (last_call_ && Clock::now() >= *last_call_) ||
          (enough && Clock::now() >= deadline)) {
        return start_round();
      }
      if (Clock::now() >= deadline) {
        const std::string message = join_timeout_message();
        broadcast_all(NodeMessage::make_exit({1, false, message}));
        throw RendezvousError(message, 1);
      }
      const int timeout = ms_until(last_call_ ? std::min(*last_call_, deadline) : deadline);
      if (poll_once(relay, timeout)) return std::nullopt;
    }
  }

  // After a node joined or left while gathering: torchrun's last call opens when the MIN-th node
  // arrives and closes if the nodes drop below MIN again.
  void count_changed() {
    if (count() < config_.min_nodes) {
      last_call_.reset();
    } else if (!last_call_ && count() < config_.max_nodes) {
      last_call_ = Clock::now() + config_.last_call_timeout;
      std::cerr << "cpprun: " << count() << " node" << (count() == 1 ? "" : "s") << " (--nnodes=" << nnodes_text()
                << ") at " << endpoint() << "; starting round " << round_ << " in "
                << seconds_text(config_.last_call_timeout)
                << " unless more join (--rdzv_conf last_call_timeout)\n";
    }
    for (Node& n : nodes_) n.link.send(NodeMessage::make_gathering(round_, count()));
  }

  std::string join_timeout_message() const {
    return "cpprun: rendezvous timed out after " + seconds_text(config_.join_timeout) +
           " (--rdzv_conf join_timeout): " + std::to_string(count()) + " of the at least " +
           std::to_string(config_.min_nodes) + " nodes that --nnodes=" + nnodes_text() + " needs joined at " +
           endpoint() + " (--rdzv_id=" + config_.run_id + "). Start cpprun on more nodes with the same " +
           "--rdzv_endpoint, --rdzv_id and --nnodes, or raise --rdzv_conf join_timeout=SECONDS.";
  }

  RankLayout start_round() {
    phase_ = Phase::kRunning;
    pacer_.attempt_started();
    end_.reset();
    why_ = RoundEnd::kNone;
    self_done_ = false;
    last_call_.reset();
    int master_port = 0;
    try {
      master_port = pick_free_port();  // for worker rank 0's store, on this host, as torchrun picks it
    } catch (const std::system_error& e) {
      throw RendezvousError(std::string("cpprun: cannot find a free port for the workers' MASTER_PORT: ") + e.what(),
                            1);
    }
    std::vector<NodeShape> shapes{{config_.nproc_per_node, config_.role}};
    for (const Node& n : nodes_) shapes.push_back(n.hello.shape);
    const auto layout_of = [&](int group_rank) {
      RankLayout layout = multi_node_layout(shapes, group_rank);
      layout.agent_store = false;
      layout.master_port = master_port;
      return layout;
    };
    std::string ranks = "node 0: " + rank_range(0, shapes[0].local_world_size);
    for (std::size_t i = 0; i < nodes_.size(); ++i) {
      Node& n = nodes_[i];
      n.group_rank = static_cast<int>(i) + 1;
      n.state = NodeState::kRunning;
      const RankLayout layout = layout_of(n.group_rank);
      n.link.send(NodeMessage::make_start(round_, restart_count_, layout));
      ranks += ", node " + std::to_string(n.group_rank) + " (" + n.link.peer() + "): " +
               rank_range(layout.base_rank, n.hello.shape.local_world_size);
    }
    for (Node& n : queued_) n.link.send(NodeMessage::make_queued(round_, count(), false));
    const RankLayout own = layout_of(0);
    std::cerr << "cpprun: rendezvous round " << round_ << " complete at " << endpoint() << ": " << count() << " node"
              << (count() == 1 ? "" : "s") << " of --nnodes=" << nnodes_text() << ", " << own.world_size
              << (own.world_size == 1 ? " worker (" : " workers (") << ranks << "), MASTER_PORT=" << master_port
              << "\n";
    return own;
  }

  // Every remaining node has stopped its workers: gather the next round, or end the job.
  JobDecision next_round(SignalRelay& relay) {
    const bool counted = why_ == RoundEnd::kWorkerFailed;
    const int available = count() + static_cast<int>(queued_.size());
    if (available < config_.min_nodes) {
      const JobEnd end{1, false,
                       decisive_.reason + "; only " + std::to_string(available) + " node" +
                           (available == 1 ? "" : "s") + " remain" + (available == 1 ? "s" : "") +
                           ", fewer than the " + std::to_string(config_.min_nodes) + " that --nnodes=" +
                           nnodes_text() + " needs, so the job cannot go on"};
      broadcast_all(NodeMessage::make_exit(end));
      return {JobDecision::Kind::kExit, {}, end};
    }
    if (counted) ++restart_count_;
    ++round_;
    std::optional<RankLayout> layout = gather(relay, Clock::now());
    if (!layout) return interrupted();
    return {JobDecision::Kind::kRestart, *layout, {}};
  }

  JobDecision interrupted() {
    const JobEnd end{128 + pending_signal_, false,
                     "the agent hosting the rendezvous at " + endpoint() + " received " + signal_name(pending_signal_)};
    broadcast_all(NodeMessage::make_exit(end));
    return {JobDecision::Kind::kExit, {}, end};
  }

  bool all_nodes(NodeState state) const {
    return std::all_of(nodes_.begin(), nodes_.end(), [&](const Node& n) { return n.state == state; });
  }

  bool anyone_done() const {
    return self_done_ ||
           std::any_of(nodes_.begin(), nodes_.end(), [](const Node& n) { return n.state == NodeState::kDone; });
  }

  void broadcast_all(const NodeMessage& message) {
    for (Node& n : nodes_) n.link.send(message);
    for (Node& n : queued_) n.link.send(message);
  }

  // The first end is told to every node; the strongest decides. See RoundEnd.
  void end_round(RoundEnd why, const JobEnd& end) {
    if (strength(why) > strength(why_)) {
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
    if (phase_ == Phase::kGathering) {
      std::cerr << "cpprun: warning: " << who << " left before round " << round_ << " started\n";
      count_changed();
      return;
    }
    // A node whose workers all succeeded has done its part; the others need not start over for it.
    if (node.state == NodeState::kDone) {
      std::cerr << "cpprun: warning: " << who << " " << why << " after its workers succeeded\n";
      return;
    }
    end_round(RoundEnd::kNodeLost, {1, false, who + " " + why});
  }

  // Returns true when a job-ending signal arrived (in pending_signal_).
  bool poll_once(SignalRelay& relay, int timeout_ms) {
    pending_signal_ = poll_links(relay, fds(), timeout_ms, [this](int fd) { on_readable(fd); });
    return pending_signal_ != 0;
  }

  void refuse(NodeLink& link, const std::string& why) {
    std::cerr << "cpprun: warning: refused the agent at " << link.peer() << ": " << why << "\n";
    link.send(NodeMessage::make_exit(
        {2, false, "cpprun: the agent hosting the rendezvous at " + endpoint() + " refused this agent: " + why}));
  }

  // Checks that the agent belongs to this job; refuses it with both values otherwise.
  bool acceptable(NodeLink& link, const NodeMessage& message) {
    if (message.kind != MessageKind::kHello) {
      refuse(link, "it did not introduce itself");
      return false;
    }
    const NodeHello& h = message.hello;
    if (h.protocol != kNodeProtocolVersion) {
      refuse(link, "it speaks agent protocol " + std::to_string(h.protocol) + ", the host speaks " +
                       std::to_string(kNodeProtocolVersion) + "; run the same cpprun version on every node");
      return false;
    }
    if (h.backend != "c10d") {
      refuse(link, "it has --rdzv_backend=" + h.backend + " but the job at " + endpoint() +
                       " has --rdzv_backend=c10d; every node needs the same --rdzv_backend");
      return false;
    }
    if (h.run_id != config_.run_id) {
      refuse(link, "it has --rdzv_id=" + h.run_id + " but the job at " + endpoint() + " has --rdzv_id=" +
                       config_.run_id + "; every node of a job needs the same --rdzv_id (or another "
                       "--rdzv_endpoint for another job)");
      return false;
    }
    if (h.min_nodes != config_.min_nodes || h.max_nodes != config_.max_nodes) {
      refuse(link, "it has --nnodes=" + std::to_string(h.min_nodes) + ":" + std::to_string(h.max_nodes) +
                       " but the job at " + endpoint() + " has --nnodes=" + nnodes_text() +
                       "; every node needs the same --nnodes");
      return false;
    }
    if (h.max_restarts != config_.max_restarts) {
      refuse(link, "it has --max_restarts=" + std::to_string(h.max_restarts) + " but the job at " + endpoint() +
                       " has --max_restarts=" + std::to_string(config_.max_restarts) +
                       "; nodes restart together, so they need the same value");
      return false;
    }
    return true;
  }

  void admit(NodeLink link, const NodeMessage& message) {
    if (!acceptable(link, message)) return;
    Node node{std::move(link), message.hello, NodeState::kJoined, -1};
    if (phase_ == Phase::kGathering && count() < config_.max_nodes) {
      nodes_.push_back(std::move(node));
      count_changed();
      return;
    }
    // A round runs (or is full): the node waits for the next. Torchrun's agents restart for it when
    // the job has room and is not finishing; so do we. See Note [Elastic rounds].
    node.state = NodeState::kQueued;
    const bool room = count() + static_cast<int>(queued_.size()) < config_.max_nodes;
    const bool taken_in = phase_ == Phase::kRunning && room && (end_ || !anyone_done());
    node.link.send(NodeMessage::make_queued(round_, count(), taken_in));
    const std::string who = "the agent at " + node.link.peer();
    queued_.push_back(std::move(node));
    if (taken_in && !end_) {
      std::cerr << "cpprun: " << who << " joined the running job; ending round " << round_ << " to take it in\n";
      end_round(RoundEnd::kNodeJoined,
                {1, true,
                 "a new node (" + who + ") joined the job at " + endpoint() + "; restarting every node's workers to "
                 "take it in (a membership change: not counted against --max_restarts)"});
    } else if (!taken_in) {
      std::cerr << "cpprun: " << who << " joined; it waits for a next round ("
                << (room ? "the job is finishing" : "the job runs at its maximum of --nnodes=" + nnodes_text())
                << ")\n";
    }
  }

  void read_node(std::size_t i) {
    NodeLink::Received got = nodes_[i].link.receive();
    for (const NodeMessage& message : got.messages) handle(nodes_[i], message);
    if (!got.violation.empty()) {
      lose(i, got.violation);
    } else if (got.closed) {
      lose(i, "is gone: it was killed, or its host or network went down");
    }
  }

  void read_queued(std::size_t i) {
    NodeLink::Received got = queued_[i].link.receive();  // a queued node says nothing until its round
    if (got.closed) {
      std::cerr << "cpprun: warning: " << describe(queued_[i]) << " left before it got into a round\n";
      queued_.erase(queued_.begin() + static_cast<long>(i));
    }
  }

  void handle(Node& node, const NodeMessage& message) {
    if (message.round != round_ || phase_ != Phase::kRunning) return;  // news of an earlier round
    switch (message.kind) {
      case MessageKind::kDone:
        node.state = NodeState::kDone;
        break;
      case MessageKind::kFailed:
        node.state = NodeState::kFailed;
        end_round(message.end.restartable ? RoundEnd::kWorkerFailed : RoundEnd::kFatal, message.end);
        break;
      case MessageKind::kStopped:
        node.state = NodeState::kStopped;
        break;
      default:
        break;  // members send nothing else once joined
    }
  }

  const LaunchConfig& config_;
  const Clock::time_point started_;
  LinkListener listener_;
  PendingLinks pending_;  // connected, not introduced yet
  std::vector<Node> nodes_;        // this round's other nodes, in join order (group ranks 1, 2, ...)
  std::vector<Node> queued_;       // arrived while a round ran, in arrival order
  Phase phase_ = Phase::kGathering;
  std::optional<Clock::time_point> last_call_;
  int round_ = 0;
  int restart_count_ = 0;
  std::optional<JobEnd> end_;  // what the nodes were told ended the round
  RoundEnd why_ = RoundEnd::kNone;
  JobEnd decisive_;  // the end that decides: see RoundEnd
  bool self_done_ = false;
  int pending_signal_ = 0;
  RestartPacer pacer_{config_.restart_backoff};  // the backoff before every node's restart
};

}  // namespace

std::unique_ptr<NodeRendezvous> make_elastic_host(const LaunchConfig& config, LinkListener listener,
                                                  Clock::time_point started) {
  return std::make_unique<ElasticHost>(config, std::move(listener), started);
}

}  // namespace cpprun::launcher
