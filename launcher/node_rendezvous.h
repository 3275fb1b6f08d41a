// Static rendezvous between the agents of a multi-node job (--nnodes=K): node 0's agent hosts it
// (RendezvousHost), the others join it (RendezvousMember). It numbers the workers across nodes,
// makes a failure anywhere stop every node, restarts all nodes together, and lets no node exit
// before the others are done (torchrun's exit barrier). See node_messages.h for the conversation
// and Note [Agent store] for the c10d store the workers share.
//
// Note [Why links and not store keys]
// torchrun's agents rendezvous through keys in the store. Ours only find each other there (node 0
// publishes a port) and then talk over one TCP link per member (node_link.h), because a c10d store
// cannot tell node 0 that another agent died (torchrun's dynamic rendezvous polls heartbeat keys
// for that), cannot wait for the first of several keys, and cannot be interrupted: a waiting agent
// would sit in a LibTorch thread, deaf to Ctrl-C. A link's end is seen by poll() the moment an agent
// is killed, in the same loop that watches the workers and the signals, with no thread and no
// timer. And the store is recreated each round (Note [Agent store]), which no agent could stay
// connected through.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

#include "launch_config.h"
#include "node_messages.h"
#include "rank_layout.h"
#include "signal_relay.h"
#include "worker_group.h"

namespace cpprun::launcher {

// The rendezvous failed (a node never came, nodes disagree, node 0 is unreachable). The message
// says which nodes and what to do; the agent exits with exit_code().
class RendezvousError : public std::runtime_error {
 public:
  RendezvousError(const std::string& message, int exit_code) : std::runtime_error(message), exit_code_(exit_code) {}
  int exit_code() const { return exit_code_; }

 private:
  int exit_code_;
};

// What the job does once this node's attempt is over.
struct JobDecision {
  enum class Kind {
    kFinish,   // every node's workers succeeded: exit 0
    kRestart,  // start the next round with `layout`
    kExit,     // the job failed (or was stopped): exit with end.exit_code
  };
  Kind kind = Kind::kFinish;
  RankLayout layout;  // kRestart
  JobEnd end;         // kExit
};

class NodeRendezvous : public PeerEvents {
 public:
  // Waits until all --nnodes nodes have joined and returns this node's ranks for round 0. Throws
  // RendezvousError after --rdzv_conf join_timeout, naming the node ranks that never came. A
  // job-ending signal makes it return nullopt with the signal in `signal`.
  virtual std::optional<RankLayout> join(SignalRelay& relay, int& signal) = 0;

  // The round (= TORCHELASTIC_RESTART_COUNT) being run.
  virtual int round() const = 0;

  // Why another node ended the attempt; valid once attempt_ended().
  virtual const JobEnd& peer_end() const = 0;

  // This node's attempt is over; each tells the other nodes at once, before workers are stopped.
  virtual void report_done() = 0;                       // every local worker succeeded
  virtual void report_failed(const JobEnd& end) = 0;    // a local worker failed
  virtual void report_interrupted(const JobEnd& end) = 0;  // this agent got a job-ending signal; it exits

  // Called once this node's workers have finished or been stopped (not after report_interrupted):
  // waits for the job's decision. The exit barrier: a done node waits here until every node is.
  virtual JobDecision decide(SignalRelay& relay) = 0;
};

std::unique_ptr<NodeRendezvous> make_rendezvous_host(const LaunchConfig& config);
std::unique_ptr<NodeRendezvous> make_rendezvous_member(const LaunchConfig& config);

// The key under which node 0 publishes the port of its LinkListener. See Note [Agent store].
inline constexpr const char* kLinkPortKey = "agent/link_port";

// The agent store's timeout for connecting and reading a key; node 0 is known to be up by then.
inline constexpr std::chrono::milliseconds kStoreTimeout{30000};

// The job-ending signal among the pending ones, or 0. Others (SIGCHLD, SIGUSR1) are dropped: no
// worker runs while the agents are rendezvousing or deciding.
int take_ending_signal(SignalRelay& relay);

// "the agent of node 1 (10.0.0.2:41234)"; without the address when `peer` is empty.
std::string describe_agent(int node_rank, const std::string& peer);

// "3 s", "0.5 s"
std::string seconds_text(std::chrono::milliseconds ms);

}  // namespace cpprun::launcher
