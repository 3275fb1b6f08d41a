// Node 0's side of the static rendezvous: hosts the c10d store and accepts the other agents'
// links, then relays every node's news to the others and makes the job's decisions.
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <iostream>
#include <vector>

#include "agent_store.h"
#include "node_link.h"
#include "pending_links.h"
#include "node_rendezvous.h"
#include "restart_pacer.h"

namespace cpprun::launcher {
namespace {

using Clock = std::chrono::steady_clock;

// After a restartable failure, how long node 0 waits for the other nodes to report their workers
// stopped, beyond --shutdown_timeout, before it counts a silent one as lost.
constexpr std::chrono::seconds kStopSlack{30};

class RendezvousHost final : public NodeRendezvous {
 public:
  explicit RendezvousHost(const LaunchConfig& config)
      : config_(config), started_(Clock::now()), on_loopback_(is_loopback_host(config.master_addr)),
        listener_(on_loopback_, config.job_secret),
        members_(static_cast<std::size_t>(config.nnodes)) {
    open_store();
  }

  std::optional<RankLayout> join(SignalRelay& relay, int& signal) override {
    const auto deadline = started_ + config_.join_timeout;
    for (;;) {
      if (missing().empty()) return start_round();
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) {
        const std::string message = join_timeout_message();
        broadcast(NodeMessage::make_exit({1, false, message}));
        throw RendezvousError(message, 1);
      }
      if (poll_once(relay, static_cast<int>(std::min<long long>(left.count(), 1 << 30)))) {
        signal = pending_signal_;
        const JobEnd end{128 + signal, false,
                         "cpprun: " + describe_agent(0, "") + " received " + signal_name(signal) +
                             " before the job started"};
        broadcast(NodeMessage::make_exit(end));
        return std::nullopt;
      }
    }
  }

  int round() const override { return round_; }
  int restart_count() const override { return round_; }
  const JobEnd& peer_end() const override { return *end_; }

  std::vector<int> fds() const override {
    std::vector<int> fds;
    for (const Member& m : members_) {
      if (m.link && m.link->fd() >= 0) fds.push_back(m.link->fd());
    }
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
    for (int node = 1; node < config_.nnodes; ++node) {
      Member& m = members_[node];
      if (m.link && m.link->fd() == fd) {
        read_member(node);
        return;
      }
    }
  }

  bool attempt_ended() const override { return end_.has_value(); }

  void report_done() override { self_done_ = true; }

  void report_failed(const JobEnd& end) override { end_round(end); }

  void report_interrupted(const JobEnd& end) override {
    if (!end_) end_ = end;
    broadcast(NodeMessage::make_exit(end));
  }

  JobDecision decide(SignalRelay& relay) override {
    std::optional<Clock::time_point> stop_deadline;
    for (;;) {
      if (!end_) {
        if (all_members(MemberState::kDone)) {
          broadcast(NodeMessage::make_exit({0, false, ""}));
          return {JobDecision::Kind::kFinish, {}, {}};
        }
      } else if (!end_->restartable || round_ >= config_.max_restarts) {
        broadcast(NodeMessage::make_exit(*end_));
        return {JobDecision::Kind::kExit, {}, *end_};
      } else if (all_members(MemberState::kStopped)) {
        stop_deadline = pacer_.restart_at(round_ + 1, config_.max_restarts);  // polls the links until then
        if (Clock::now() >= *stop_deadline) return restart();
      } else if (!stop_deadline) {
        stop_deadline = Clock::now() + config_.shutdown_timeout + kStopSlack;
      } else if (Clock::now() >= *stop_deadline) {
        for (int node = 1; node < config_.nnodes; ++node) {
          if (members_[node].state != MemberState::kStopped) {
            lose(node, "did not report its workers stopped within --shutdown_timeout + " +
                           std::to_string(kStopSlack.count()) + " s");
          }
        }
        continue;
      }
      int timeout = -1;
      if (stop_deadline) {
        const auto left = std::chrono::ceil<std::chrono::milliseconds>(*stop_deadline - Clock::now());
        timeout = static_cast<int>(std::clamp<long long>(left.count(), 0, 1 << 30));
      }
      if (poll_once(relay, timeout)) {
        const JobEnd end{128 + pending_signal_, false,
                         describe_agent(0, "") + " received " + signal_name(pending_signal_)};
        broadcast(NodeMessage::make_exit(end));
        return {JobDecision::Kind::kExit, {}, end};
      }
    }
  }

 private:
  enum class MemberState {
    kAbsent,   // not joined (yet, or it left before the job started)
    kRunning,  // joined; once the round started, its workers run
    kDone,     // its workers all succeeded this round
    kFailed,   // it reported a failure this round
    kStopped,  // its workers of this round are stopped
    kLost,     // its link is gone
  };

  struct Member {
    std::optional<NodeLink> link;
    NodeHello hello;
    MemberState state = MemberState::kAbsent;
    bool ever_joined = false;  // for the join time-out's message
  };

  std::string endpoint() const { return config_.master_addr + ":" + std::to_string(config_.master_port); }

  // A fresh store each round: see Note [Agent store].
  void open_store() {
    store_.reset();
    try {
      store_.emplace(AgentStore::host(config_.master_port, on_loopback_, kStoreTimeout));
      store_->set(kLinkPortKey, std::to_string(listener_.port()));
    } catch (const AgentStoreError& e) {
      const std::string what = e.what();
      if (what.find("in use") != std::string::npos || what.find("EADDRINUSE") != std::string::npos) {
        throw RendezvousError("cpprun: node 0 cannot host the rendezvous store: --master_port=" +
                                  std::to_string(config_.master_port) +
                                  " is already in use on this host (another job, or one still shutting down). "
                                  "Pick a free port with --master_port=PORT on every node.\nc10d said: " + what,
                              1);
      }
      if (what.rfind("cpprun:", 0) == 0) throw RendezvousError(what, 1);
      throw RendezvousError("cpprun: node 0 cannot host the rendezvous store on port " +
                                std::to_string(config_.master_port) + ": " + what, 1);
    }
  }

  // Names the nodes that never came, and apart from them those that came and left again.
  std::string join_timeout_message() const {
    std::vector<int> never;
    std::vector<int> left;
    for (int node : missing()) (members_[node].ever_joined ? left : never).push_back(node);
    const auto ranks = [](const std::vector<int>& r) {
      return std::string(r.size() == 1 ? "node rank " : "node ranks ") + join_ranks(r);
    };
    std::string message = "cpprun: rendezvous timed out after " + seconds_text(config_.join_timeout) +
                          " (--rdzv_conf join_timeout): ";
    if (!never.empty()) {
      message += ranks(never) + " of --nnodes=" + std::to_string(config_.nnodes) + " never arrived at " + endpoint();
    }
    if (!left.empty()) {
      message += std::string(never.empty() ? "" : "; ") + ranks(left) + " joined at " + endpoint() +
                 " but left again before the others came";
    }
    return message + ". Start cpprun on " + (missing().size() == 1 ? "that node" : "those nodes") +
           " with --node_rank set and the same --nnodes, --master_addr and --master_port, or raise "
           "--rdzv_conf join_timeout=SECONDS.";
  }

  std::vector<int> missing() const {
    std::vector<int> ranks;
    for (int node = 1; node < config_.nnodes; ++node) {
      if (members_[node].state == MemberState::kAbsent) ranks.push_back(node);
    }
    return ranks;
  }

  bool all_members(MemberState state) const {
    for (int node = 1; node < config_.nnodes; ++node) {
      if (members_[node].state != state) return false;
    }
    return state != MemberState::kDone || self_done_;
  }

  void broadcast(const NodeMessage& message) {
    for (int node = 1; node < config_.nnodes; ++node) {
      if (members_[node].link) members_[node].link->send(message);
    }
  }

  std::vector<NodeShape> shapes() const {
    std::vector<NodeShape> nodes{{config_.nproc_per_node, config_.role}};
    for (int node = 1; node < config_.nnodes; ++node) nodes.push_back(members_[node].hello.shape);
    return nodes;
  }

  RankLayout start_round() {
    running_ = true;
    pacer_.attempt_started();
    const std::vector<NodeShape> nodes = shapes();
    for (int node = 1; node < config_.nnodes; ++node) {
      members_[node].state = MemberState::kRunning;
      members_[node].link->send(NodeMessage::make_start(round_, round_, multi_node_layout(nodes, node)));
    }
    if (round_ == 0) {
      std::string ranks;
      for (int node = 0; node < config_.nnodes; ++node) {
        const RankLayout l = multi_node_layout(nodes, node);
        ranks += (node == 0 ? "" : ", ") + std::string("node ") + std::to_string(node) + ": " +
                 rank_range(l.base_rank, nodes[node].local_world_size);
      }
      std::cerr << "cpprun: all " << config_.nnodes << " nodes joined at " << endpoint() << "; "
                << multi_node_layout(nodes, 0).world_size << " workers (" << ranks << ")\n";
    }
    return multi_node_layout(nodes, 0);
  }

  JobDecision restart() {
    ++round_;
    end_.reset();
    self_done_ = false;
    open_store();
    JobDecision decision;
    decision.kind = JobDecision::Kind::kRestart;
    decision.layout = start_round();
    return decision;
  }

  // Ends the round for every node, once: the first end wins.
  void end_round(const JobEnd& end) {
    if (end_) return;
    end_ = end;
    broadcast(NodeMessage::make_end(round_, end));
  }

  void lose(int node, const std::string& why) {
    Member& m = members_[node];
    const std::string who = describe_agent(node, m.link ? m.link->peer() : "");
    m.link.reset();
    if (m.state == MemberState::kAbsent) return;
    m.state = MemberState::kLost;
    if (end_) end_->restartable = false;  // a restart needs every node
    end_round({1, false, who + " " + why});
  }

  // Returns true when a job-ending signal arrived (in pending_signal_).
  bool poll_once(SignalRelay& relay, int timeout_ms) {
    pending_signal_ = poll_links(relay, fds(), timeout_ms, [this](int fd) { on_readable(fd); });
    return pending_signal_ != 0;
  }

  void refuse(NodeLink& link, const std::string& why) {
    std::cerr << "cpprun: warning: refused the agent at " << link.peer() << ": " << why << "\n";
    link.send(NodeMessage::make_exit({2, false, "cpprun: node 0 refused this agent: " + why}));
  }

  void admit(NodeLink link, const NodeMessage& message) {
    if (message.kind != MessageKind::kHello) {
      refuse(link, "it did not introduce itself");
      return;
    }
    const NodeHello& h = message.hello;
    if (h.protocol != kNodeProtocolVersion) {
      refuse(link, "it speaks agent protocol " + std::to_string(h.protocol) + ", node 0 speaks " +
                       std::to_string(kNodeProtocolVersion) + "; run the same cpprun version on every node");
      return;
    }
    if (h.backend != "static") {
      refuse(link, "it has --rdzv_backend=" + h.backend + " but node 0 has --rdzv_backend=static; every node "
                       "needs the same --rdzv_backend");
      return;
    }
    const std::string who = "--node_rank=" + std::to_string(h.node_rank);
    if (h.max_nodes != config_.nnodes) {
      refuse(link, who + " has --nnodes=" + std::to_string(h.max_nodes) + " but node 0 has --nnodes=" +
                       std::to_string(config_.nnodes) + "; every node needs the same --nnodes");
      return;
    }
    if (h.node_rank < 1 || h.node_rank >= config_.nnodes) {
      refuse(link, who + (h.node_rank == 0 ? " is node 0's own rank" : " is not below --nnodes=" +
                                                                         std::to_string(config_.nnodes)) +
                       "; give each node its own --node_rank from 1 to " + std::to_string(config_.nnodes - 1));
      return;
    }
    Member& m = members_[h.node_rank];
    if (m.state != MemberState::kAbsent) {
      refuse(link, who + " has already joined from " + (m.link ? m.link->peer() : std::string("?")) +
                       "; give each node its own --node_rank");
      return;
    }
    if (running_) {
      refuse(link, "the job's " + std::to_string(config_.nnodes) + " nodes are all running already");
      return;
    }
    if (h.run_id != config_.run_id) {
      refuse(link, who + " has --rdzv_id=" + h.run_id + " but node 0 has --rdzv_id=" + config_.run_id);
      return;
    }
    if (h.max_restarts != config_.max_restarts) {
      refuse(link, who + " has --max_restarts=" + std::to_string(h.max_restarts) + " but node 0 has --max_restarts=" +
                       std::to_string(config_.max_restarts) + "; nodes restart together, so they need the same value");
      return;
    }
    m.link.emplace(std::move(link));
    m.hello = h;
    m.state = MemberState::kRunning;
    m.ever_joined = true;
    broadcast(NodeMessage::make_waiting(missing()));
  }

  void read_member(int node) {
    Member& m = members_[node];
    NodeLink::Received got = m.link->receive();
    for (const NodeMessage& message : got.messages) handle(node, message);
    if (!got.violation.empty()) {
      lose(node, got.violation);
    } else if (got.closed) {
      if (!running_) {
        std::cerr << "cpprun: warning: " << describe_agent(node, m.link ? m.link->peer() : "")
                  << " left before the job started; waiting for a node " << node << " again\n";
        m.link.reset();
        m.state = MemberState::kAbsent;
        broadcast(NodeMessage::make_waiting(missing()));
      } else {
        lose(node, "is gone: it was killed, or its host or network went down");
      }
    }
  }

  void handle(int node, const NodeMessage& message) {
    Member& m = members_[node];
    if (message.round != round_) return;  // news of an earlier round
    switch (message.kind) {
      case MessageKind::kDone:
        m.state = MemberState::kDone;
        break;
      case MessageKind::kFailed:
        m.state = MemberState::kFailed;
        end_round(message.end);
        break;
      case MessageKind::kStopped:
        m.state = MemberState::kStopped;
        break;
      default:
        break;  // members send nothing else once joined
    }
  }

  const LaunchConfig& config_;
  const Clock::time_point started_;
  // Every node is on this host (a loopback --master_addr): listen on the loopback alone. Resolved
  // once, not at every round's new store.
  const bool on_loopback_;
  LinkListener listener_;
  std::optional<AgentStore> store_;
  PendingLinks pending_;  // connected, not introduced yet
  std::vector<Member> members_;    // by node rank; [0] is this node, which has no link
  int round_ = 0;
  std::optional<JobEnd> end_;
  bool running_ = false;  // round 0 has started: no more joining
  bool self_done_ = false;
  int pending_signal_ = 0;
  RestartPacer pacer_{config_.restart_backoff};  // the backoff before every node's restart
};

}  // namespace

std::unique_ptr<NodeRendezvous> make_rendezvous_host(const LaunchConfig& config) {
  return std::make_unique<RendezvousHost>(config);
}

}  // namespace cpprun::launcher
