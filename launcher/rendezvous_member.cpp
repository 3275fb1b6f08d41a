// A member's side of the rendezvous: static (node rank > 0: find node 0 through its store) or c10d
// (already connected to the agent at --rdzv_endpoint). Keeps the link to the host's agent, reports
// this node's news and follows the host's decisions.
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <iostream>
#include <vector>

#include "agent_store.h"
#include "node_link.h"
#include "node_rendezvous.h"

namespace cpprun::launcher {
namespace {

using Clock = std::chrono::steady_clock;

// While node 0 is not up yet, how often to try its port again.
constexpr std::chrono::milliseconds kRetryInterval{100};
// Once linked to node 0, how long past its own join timeout a member waits for node 0's verdict,
// which names the missing nodes best (node 0's clock started about when this one's did).
constexpr std::chrono::seconds kVerdictGrace{3};
// c10d: the host answers a hello at once; silence this long means the endpoint is something else.
constexpr std::chrono::seconds kFirstWordTimeout{10};

class RendezvousMember final : public NodeRendezvous {
 public:
  // Static: `link` is empty, join() finds node 0. c10d: connected to the endpoint's agent.
  RendezvousMember(const LaunchConfig& config, std::optional<NodeLink> link, Clock::time_point started)
      : config_(config), started_(started), elastic_(config.rdzv_backend == RendezvousBackend::kC10d),
        link_(std::move(link)) {}

  std::optional<RankLayout> join(SignalRelay& relay, int& signal) override {
    const auto deadline = started_ + config_.join_timeout;
    if (!link_ && !connect_static(relay, deadline, signal)) return std::nullopt;
    NodeHello hello;
    hello.backend = backend_name(config_.rdzv_backend);
    hello.node_rank = elastic_ ? -1 : config_.node_rank;
    hello.min_nodes = config_.min_nodes;
    hello.max_nodes = config_.max_nodes;
    hello.max_restarts = config_.max_restarts;
    hello.run_id = config_.run_id;
    hello.shape = {config_.nproc_per_node, config_.role};
    link_->send(NodeMessage::make_hello(hello));
    const auto connected = Clock::now();

    for (;;) {
      if (start_) {
        const RankLayout layout = take_start();
        if (elastic_) {
          std::cerr << "cpprun: joined the c10d rendezvous at " << endpoint() << " (--rdzv_id=" << config_.run_id
                    << "): round " << round_ << ", node " << layout.group_rank << " of " << layout.group_world_size
                    << ", " << rank_range(layout.base_rank, config_.nproc_per_node) << " of WORLD_SIZE="
                    << layout.world_size << "\n";
        }
        return layout;
      }
      if (decision_) throw verdict_before_start();
      if (elastic_ && !heard_ && Clock::now() >= connected + kFirstWordTimeout) {
        throw RendezvousError("cpprun: " + endpoint() + " (--rdzv_endpoint) accepted a connection but did not "
                                  "answer as a cpprun c10d rendezvous within " +
                                  std::to_string(kFirstWordTimeout.count()) +
                                  " s: is another program (or a static job's store) using that port? Pick "
                                  "another --rdzv_endpoint port for every node.",
                              1);
      }
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline + kVerdictGrace - Clock::now());
      if (left.count() <= 0) throw RendezvousError(elastic_ ? elastic_timeout_message() : static_timeout_message(), 1);
      const long long wait = elastic_ && !heard_ ? std::min<long long>(left.count(), 1000) : left.count();
      if ((signal = poll_once(relay, static_cast<int>(std::min<long long>(wait, 1 << 30)))) != 0) {
        return std::nullopt;
      }
    }
  }

  int round() const override { return round_; }
  int restart_count() const override { return restart_count_; }
  const JobEnd& peer_end() const override { return *end_; }

  std::vector<int> fds() const override {
    if (link_ && link_->fd() >= 0) return {link_->fd()};
    return {};
  }

  void on_readable(int) override { read_link(); }

  bool attempt_ended() const override { return end_.has_value(); }

  void report_done() override {
    self_done_ = true;
    link_->send(NodeMessage::make_done(round_));
  }

  void report_failed(const JobEnd& end) override { link_->send(NodeMessage::make_failed(round_, end)); }

  void report_interrupted(const JobEnd& end) override { link_->send(NodeMessage::make_failed(round_, end)); }

  JobDecision decide(SignalRelay& relay) override {
    // Node 0 restarts once every node's workers are stopped; done ones count once the round ended.
    if (!self_done_ || end_) send_stopped();
    for (;;) {
      if (decision_) {
        JobDecision decision = *decision_;
        decision_.reset();
        return decision;
      }
      if (start_) {
        JobDecision decision;
        decision.kind = JobDecision::Kind::kRestart;
        decision.layout = take_start();
        return decision;
      }
      if (const int signal = poll_once(relay, -1); signal != 0) {
        JobEnd end{128 + signal, false, describe_agent(group_rank_, "") + " received " + signal_name(signal)};
        link_->send(NodeMessage::make_failed(round_, end));
        return {JobDecision::Kind::kExit, {}, end};
      }
    }
  }

 private:
  std::string endpoint() const { return endpoint_text(config_); }

  // Static: node 0's store at --master_addr:--master_port tells the port of its agent's links.
  bool connect_static(SignalRelay& relay, Clock::time_point deadline, int& signal) {
    AgentStore::load();  // while node 0 may still be starting
    if (!reach_store(relay, deadline, signal)) return false;
    const int link_port = read_link_port(deadline);
    ConnectResult connected = connect_link(config_.master_addr, link_port, kStoreTimeout, relay.wake_fd(), config_.job_secret);
    if (connected.status == ConnectStatus::kInterrupted && (signal = take_ending_signal(relay)) != 0) {
      return false;
    }
    if (connected.status != ConnectStatus::kConnected) {
      throw RendezvousError("cpprun: node " + std::to_string(config_.node_rank) + " reached node 0's store at " +
                                endpoint() + " but not node 0's agent on port " + std::to_string(link_port) +
                                " (" + connected.error +
                                "). cpprun's agents talk over that second port, which node 0's kernel picks; a "
                                "firewall must let the nodes reach each other on such ports, as Gloo needs too.",
                            1);
    }
    link_.emplace(std::move(*connected.link));
    return true;
  }

  std::string static_timeout_message() const {
    return "cpprun: rendezvous timed out after " + seconds_text(config_.join_timeout) +
           " (--rdzv_conf join_timeout): node rank" + (missing_.size() == 1 ? " " : "s ") + join_ranks(missing_) +
           " of --nnodes=" + std::to_string(config_.nnodes) + " never arrived at " + endpoint() +
           " (as node 0 last reported). Start cpprun on " + (missing_.size() == 1 ? "that node" : "those nodes") +
           " with --node_rank set and the same --nnodes, --master_addr and --master_port, or raise "
           "--rdzv_conf join_timeout=SECONDS.";
  }

  // The host is silent past the join timeout: it only enforces the timeout while gathering.
  std::string elastic_timeout_message() const {
    const std::string nnodes =
        "--nnodes=" + std::to_string(config_.min_nodes) + ":" + std::to_string(config_.max_nodes);
    if (queued_) {
      return "cpprun: this node waited " + seconds_text(config_.join_timeout) +
             " (--rdzv_conf join_timeout) for a place in the job at " + endpoint() + ", which runs round " +
             std::to_string(status_round_) + " on " + std::to_string(status_nodes_) + " nodes (" + nnodes +
             ") and took it in no new round. Raise --rdzv_conf join_timeout=SECONDS to wait longer.";
    }
    return "cpprun: rendezvous timed out after " + seconds_text(config_.join_timeout) +
           " (--rdzv_conf join_timeout): " + std::to_string(status_nodes_) + " of the at least " +
           std::to_string(config_.min_nodes) + " nodes that " + nnodes + " needs had joined at " + endpoint() +
           " (as its host last reported). Start cpprun on more nodes with the same --rdzv_endpoint, --rdzv_id and "
           "--nnodes, or raise --rdzv_conf join_timeout=SECONDS.";
  }

  // The host said `exit` before this node got into a round: it was refused, the job failed, or
  // (queued) the job finished without it.
  RendezvousError verdict_before_start() const {
    const JobEnd& end = decision_->end;
    if (end.exit_code == 0) {
      return RendezvousError("cpprun: the job at " + endpoint() + " (--rdzv_id=" + config_.run_id +
                                 ") finished before this node got into a round; nothing ran here",
                             0);
    }
    return RendezvousError(end.reason, end.exit_code);
  }

  // Waits until something accepts connections at MASTER_ADDR:MASTER_PORT: node 0 may start last.
  // Plain connects rather than c10d's own retries, so that a signal ends the wait at once.
  bool reach_store(SignalRelay& relay, Clock::time_point deadline, int& signal) {
    std::string last_error;
    for (;;) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) {
        throw RendezvousError(
            "cpprun: rendezvous timed out after " + seconds_text(config_.join_timeout) +
                " (--rdzv_conf join_timeout): node rank 0 never arrived: nothing answered at " + endpoint() +
                (last_error.empty() ? "" : " (" + last_error + ")") +
                ". Start cpprun with --node_rank=0 on the host of --master_addr, with the same --master_port, "
                "or check that this host can reach that address.",
            1);
      }
      ConnectResult probe = connect_link(config_.master_addr, config_.master_port,
                                         std::min<std::chrono::milliseconds>(left, std::chrono::seconds(5)),
                                         relay.wake_fd(), config_.job_secret);
      if (probe.status == ConnectStatus::kConnected) return true;  // a reachability probe, closed unused
      if (probe.status == ConnectStatus::kFailed) {
        last_error = probe.error;
        pollfd wake{relay.wake_fd(), POLLIN, 0};
        poll(&wake, 1, static_cast<int>(std::min(left, kRetryInterval).count()));
      }
      if ((signal = take_ending_signal(relay)) != 0) return false;
    }
  }

  int read_link_port(Clock::time_point deadline) {
    // Node 0 publishes the port as soon as its store runs; a store without it is someone else's.
    const auto timeout = std::clamp(std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()),
                                    std::chrono::milliseconds(1000), kStoreTimeout);
    std::string value;
    try {
      AgentStore store = AgentStore::connect(config_.master_addr, config_.master_port, timeout);
      value = store.get(kLinkPortKey);
    } catch (const AgentStoreError& e) {
      const std::string what = e.what();
      if (what.rfind("cpprun:", 0) == 0) throw RendezvousError(what, 1);
      throw RendezvousError("cpprun: " + endpoint() + " answers, but not as node 0's cpprun agent (no " +
                                kLinkPortKey + " in its store within " + seconds_text(timeout) +
                                "): is another job using --master_port=" + std::to_string(config_.master_port) +
                                "?\nc10d said: " + what,
                            1);
    }
    try {
      return std::stoi(value);
    } catch (const std::exception&) {
      throw RendezvousError("cpprun: node 0's store at " + endpoint() + " holds " + kLinkPortKey + "='" + value +
                                "', not a port; is node 0 running the same cpprun version?",
                            1);
    }
  }

  RankLayout take_start() {
    RankLayout layout = start_->layout;
    round_ = start_->round;
    restart_count_ = start_->restart_count;
    start_.reset();
    end_.reset();
    queued_ = false;
    self_done_ = false;
    stopped_sent_ = false;
    layout.agent_store = !elastic_;  // c10d: worker rank 0 hosts the workers' store, as with torchrun's c10d
    group_rank_ = layout.group_rank;
    return layout;
  }

  void send_stopped() {
    if (stopped_sent_) return;
    link_->send(NodeMessage::make_stopped(round_));
    stopped_sent_ = true;
  }

  // Returns the job-ending signal that arrived, or 0.
  int poll_once(SignalRelay& relay, int timeout_ms) {
    return poll_links(relay, fds(), timeout_ms, [this](int) { read_link(); });  // fds(): the link alone
  }

  void read_link() {
    NodeLink::Received got = link_->receive();
    for (const NodeMessage& message : got.messages) handle(message);
    if (got.closed && !decision_) {
      std::string why = !got.refused.empty()     ? got.refused
                        : !got.violation.empty() ? got.violation
                                                 : "is gone: it was killed, or its host or network went down";
      // See Note [Elastic rounds]: the rendezvous lives in the host's agent.
      if (elastic_) why += "; the job cannot go on without the agent that hosts its c10d rendezvous";
      const std::string who = elastic_ ? "the agent hosting the c10d rendezvous at " + endpoint() + " (" +
                                             link_->peer() + ")"
                                       : describe_agent(0, link_->peer());
      const JobEnd lost{1, false, who + " " + why};
      if (!end_) end_ = lost;
      decision_ = JobDecision{JobDecision::Kind::kExit, {}, lost};
    }
  }

  void handle(const NodeMessage& message) {
    heard_ = true;
    switch (message.kind) {
      case MessageKind::kWaiting:
        missing_ = message.missing;
        break;
      case MessageKind::kGathering:
        status_round_ = message.round;
        status_nodes_ = message.nodes;
        queued_ = false;
        break;
      case MessageKind::kQueued:
        if (!queued_) {
          std::cerr << "cpprun: the job at " << endpoint() << " is running round " << message.round << " on "
                    << message.nodes << " node" << (message.nodes == 1 ? "" : "s") << "; this node joins it "
                    << (message.restarting ? "now: that round is being ended to take it in"
                                           : "in its next round, if one starts within --rdzv_conf join_timeout "
                                             "(the job is at --nnodes MAX, or finishing)")
                    << "\n";
        }
        status_round_ = message.round;
        status_nodes_ = message.nodes;
        queued_ = true;
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
      case MessageKind::kExit:
        if (!end_) end_ = message.end;
        decision_ = JobDecision{message.end.exit_code == 0 ? JobDecision::Kind::kFinish : JobDecision::Kind::kExit,
                                {},
                                message.end};
        break;
      default:
        break;  // node 0 sends nothing else
    }
  }

  const LaunchConfig& config_;
  const Clock::time_point started_;
  const bool elastic_;  // c10d
  std::optional<NodeLink> link_;
  int round_ = 0;
  int restart_count_ = 0;
  int group_rank_ = -1;
  std::vector<int> missing_;          // static: as node 0 last reported
  bool heard_ = false;                // the host has said something
  bool queued_ = false;               // c10d: a round runs without this node
  int status_round_ = 0;              // c10d: the round the host last reported
  int status_nodes_ = 1;              // c10d: its nodes, as the host last reported
  std::optional<NodeMessage> start_;  // a round's start, not yet taken
  std::optional<JobEnd> end_;         // why the attempt ended elsewhere
  std::optional<JobDecision> decision_;
  bool self_done_ = false;
  bool stopped_sent_ = false;
};

}  // namespace

std::unique_ptr<NodeRendezvous> make_rendezvous_member(const LaunchConfig& config) {
  return std::make_unique<RendezvousMember>(config, std::nullopt, Clock::now());
}

std::unique_ptr<NodeRendezvous> make_elastic_member(const LaunchConfig& config, NodeLink link,
                                                    Clock::time_point started) {
  return std::make_unique<RendezvousMember>(config, std::move(link), started);
}

}  // namespace cpprun::launcher
