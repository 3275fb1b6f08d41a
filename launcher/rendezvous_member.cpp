// A member's side of the static rendezvous (node rank > 0): find node 0 through its store, keep a
// link to its agent, report this node's news and follow node 0's decisions.
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

class RendezvousMember final : public NodeRendezvous {
 public:
  explicit RendezvousMember(const LaunchConfig& config) : config_(config), started_(Clock::now()) {}

  std::optional<RankLayout> join(SignalRelay& relay, int& signal) override {
    const auto deadline = started_ + config_.join_timeout;
    AgentStore::load();  // while node 0 may still be starting
    if (!reach_store(relay, deadline, signal)) return std::nullopt;
    const int link_port = read_link_port(deadline);
    ConnectResult connected = connect_link(config_.master_addr, link_port, kStoreTimeout, relay.wake_fd());
    if (connected.status == ConnectStatus::kInterrupted && (signal = take_ending_signal(relay)) != 0) {
      return std::nullopt;
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
    NodeHello hello;
    hello.node_rank = config_.node_rank;
    hello.nnodes = config_.nnodes;
    hello.max_restarts = config_.max_restarts;
    hello.run_id = config_.run_id;
    hello.shape = {config_.nproc_per_node, config_.role};
    link_->send(NodeMessage::make_hello(hello));

    for (;;) {
      if (start_) return take_start();
      if (decision_) throw RendezvousError(decision_->end.reason, decision_->end.exit_code);
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline + kVerdictGrace - Clock::now());
      if (left.count() <= 0) {
        throw RendezvousError(
            "cpprun: rendezvous timed out after " + seconds_text(config_.join_timeout) +
                " (--rdzv_conf join_timeout): node rank" + (missing_.size() == 1 ? " " : "s ") +
                join_ranks(missing_) + " of --nnodes=" + std::to_string(config_.nnodes) + " never arrived at " +
                endpoint() + " (as node 0 last reported). Start cpprun on " +
                (missing_.size() == 1 ? "that node" : "those nodes") +
                " with --node_rank set and the same --nnodes, --master_addr and --master_port, or raise "
                "--rdzv_conf join_timeout=SECONDS.",
            1);
      }
      if ((signal = poll_once(relay, static_cast<int>(std::min<long long>(left.count(), 1 << 30)))) != 0) {
        return std::nullopt;
      }
    }
  }

  int round() const override { return round_; }
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
        JobEnd end{128 + signal, false, describe_agent(config_.node_rank, "") + " received " + signal_name(signal)};
        link_->send(NodeMessage::make_failed(round_, end));
        return {JobDecision::Kind::kExit, {}, end};
      }
    }
  }

 private:
  std::string endpoint() const { return config_.master_addr + ":" + std::to_string(config_.master_port); }

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
                                         relay.wake_fd());
      if (probe.status == ConnectStatus::kConnected) return true;
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
    start_.reset();
    end_.reset();
    self_done_ = false;
    stopped_sent_ = false;
    layout.group_rank = config_.node_rank;
    layout.group_world_size = config_.nnodes;
    layout.agent_store = true;
    return layout;
  }

  void send_stopped() {
    if (stopped_sent_) return;
    link_->send(NodeMessage::make_stopped(round_));
    stopped_sent_ = true;
  }

  // Returns the job-ending signal that arrived, or 0.
  int poll_once(SignalRelay& relay, int timeout_ms) {
    std::vector<pollfd> fds{{relay.wake_fd(), POLLIN, 0}};
    for (int fd : this->fds()) fds.push_back({fd, POLLIN, 0});
    if (poll(fds.data(), fds.size(), timeout_ms) < 0) {
      if (errno == EINTR) return 0;
      throw std::runtime_error(std::string("cpprun: poll() failed: ") + std::strerror(errno));
    }
    if (fds[0].revents != 0) {
      if (const int signal = take_ending_signal(relay); signal != 0) return signal;
    }
    if (fds.size() > 1 && fds[1].revents != 0) read_link();
    return 0;
  }

  void read_link() {
    NodeLink::Received got = link_->receive();
    for (const NodeMessage& message : got.messages) handle(message);
    if (got.closed && !decision_) {
      const std::string why = got.bad_line.empty()
                                  ? "is gone: it was killed, or its host or network went down"
                                  : "sent a line that is not a cpprun agent message: '" + got.bad_line + "'";
      const JobEnd lost{1, false, describe_agent(0, link_->peer()) + " " + why};
      if (!end_) end_ = lost;
      decision_ = JobDecision{JobDecision::Kind::kExit, {}, lost};
    }
  }

  void handle(const NodeMessage& message) {
    switch (message.kind) {
      case MessageKind::kWaiting:
        missing_ = message.missing;
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
  std::optional<NodeLink> link_;
  int round_ = 0;
  std::vector<int> missing_;          // as node 0 last reported
  std::optional<NodeMessage> start_;  // a round's start, not yet taken
  std::optional<JobEnd> end_;         // why the attempt ended elsewhere
  std::optional<JobDecision> decision_;
  bool self_done_ = false;
  bool stopped_sent_ = false;
};

}  // namespace

std::unique_ptr<NodeRendezvous> make_rendezvous_member(const LaunchConfig& config) {
  return std::make_unique<RendezvousMember>(config);
}

}  // namespace cpprun::launcher
