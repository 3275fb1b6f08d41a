// Rendezvous between the agents of a multi-node job: one state machine for both backends, as
// torchrun has one agent. One agent hosts it (RendezvousHost), the others join it as members
// (RendezvousMember). c10d (--nnodes=MIN:MAX): the agent that can listen at --rdzv_endpoint hosts
// and numbers the nodes in the order they join (Note [Elastic rounds]). static (--nnodes=K): the
// same with MIN = MAX = K, hosted by node 0, and each node's rank fixed by its --node_rank. Either
// numbers the workers across nodes, makes a failure anywhere stop every node, restarts all nodes
// together, and lets no node exit before the others are done (torchrun's exit barrier). See
// node_messages.h for the conversation and Note [Agent store] for the c10d store the workers of a
// static job share.
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
//
// Note [Elastic rounds]
// With c10d the host gathers each round's nodes anew: round 0 completes when MAX nodes joined, or
// when MIN had joined and --rdzv_conf last_call_timeout has passed since (torchrun's rule: the
// window opens when the MIN-th node arrives and is not extended by later ones). Nodes are numbered
// in the order they joined, the host first. A round ends, and the next one is gathered from the
// remaining nodes plus those queued, when a worker fails (counted against --max_restarts), when a
// node joins a running job that has fewer than MAX nodes, or when a node is lost. The last two are
// membership changes: they do not count against --max_restarts, and TORCHELASTIC_RESTART_COUNT
// keeps its value, as torchrun's agent treats new nodes (it learns of a lost node only when its
// own workers fail, which does count; ours sees the link close, so a worker failing in the same
// round is taken for the loss's consequence). A node that comes while the job runs at MAX, or is
// already finishing, waits for a next round (or its join timeout). A lost node that leaves fewer
// than MIN ends the job; one whose workers had all succeeded is let go. The host's own agent
// cannot be lost: with it goes the rendezvous, and the members fail, as torchrun's do when the
// c10d store's host dies. A static job follows the same rules with MIN = MAX: a lost node leaves
// fewer than MIN, so it ends the job, and a node that comes while the job runs is refused (its
// --node_rank is taken).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "rendezvous/node_link.h"
#include "rendezvous/node_messages.h"
#include "rendezvous/rank_layout.h"
#include "rendezvous/rendezvous_settings.h"
#include "workers/signal_relay.h"
#include "workers/worker_group.h"

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
  // Waits until the rendezvous completes and returns this node's ranks for its first round. Throws
  // RendezvousError after --rdzv_conf join_timeout, naming the nodes that never came. A job-ending
  // signal makes it return nullopt with the signal in `signal`.
  virtual std::optional<RankLayout> join(SignalRelay& relay, int& signal) = 0;

  // The rendezvous round being run: every restart, and (c10d) every membership change, starts one.
  virtual int round() const = 0;
  // TORCHELASTIC_RESTART_COUNT: the restarts after worker failures so far. Static: round().
  virtual int restart_count() const = 0;

  // Why another node ended the attempt; valid once attempt_ended().
  virtual const JobEnd& peer_end() const = 0;

  // This node's attempt is over; each tells the other nodes at once, before workers are stopped.
  virtual void report_done() = 0;                       // every local worker succeeded
  virtual void report_failed(const JobEnd& end) = 0;    // a local worker failed
  virtual void report_interrupted(const JobEnd& end) = 0;  // this agent got a job-ending signal; it exits

  // Called once this node's workers have finished or been stopped (not after report_interrupted):
  // waits for the job's decision. The exit barrier: a done node waits here until every node is.
  // c10d: gathering the next round may time out, which throws RendezvousError.
  virtual JobDecision decide(SignalRelay& relay) = 0;
};

// Finds this agent's side (rendezvous_claim.cpp). static: node 0 hosts (its store at
// --master_addr:--master_port tells the others where its links are accepted). c10d: the agent that
// can listen at --rdzv_endpoint hosts, the others (taken, or not this machine's address) connect
// there. A member retries until --rdzv_conf join_timeout, as the host may start last. Returns nullptr
// when a job-ending signal (in `signal`) came first. Throws RendezvousError.
std::unique_ptr<NodeRendezvous> open_rendezvous(const RendezvousSettings& settings, SignalRelay& relay, int& signal);

// Its two sides, for an agent that listens for the members' links or is connected to the host.
// `started` is when the agent began to look for the rendezvous: join_timeout counts from there.
std::unique_ptr<NodeRendezvous> make_rendezvous_host(const RendezvousSettings& settings, LinkListener listener,
                                                     std::chrono::steady_clock::time_point started);
std::unique_ptr<NodeRendezvous> make_rendezvous_member(const RendezvousSettings& settings, NodeLink link,
                                                       std::chrono::steady_clock::time_point started);

// The key under which node 0 publishes the port of its LinkListener. See Note [Agent store].
inline constexpr const char* kLinkPortKey = "agent/link_port";

// The agent store's timeout for connecting and reading a key; node 0 is known to be up by then.
inline constexpr std::chrono::milliseconds kStoreTimeout{30000};

// The job-ending signal among the pending ones, or 0. Others (SIGCHLD, SIGUSR1) are dropped: no
// worker runs while the agents are rendezvousing or deciding.
int take_ending_signal(SignalRelay& relay);

// One turn of a rendezvous side's loop: waits up to timeout_ms for a signal or for data on
// `fds`, and returns the job-ending signal if one came (links unread), else calls
// on_readable(fd) for each fd with something to read and returns 0.
int poll_links(SignalRelay& relay, const std::vector<int>& fds, int timeout_ms,
               const std::function<void(int)>& on_readable);

// "the agent of node 1 (10.0.0.2:41234)"; without the address when `peer` is empty.
std::string describe_agent(int node_rank, const std::string& peer);

// "rank 4", "ranks 4-7": a node's workers.
std::string rank_range(int base_rank, int local_world_size);

// "3 s", "0.5 s"
std::string seconds_text(std::chrono::milliseconds ms);

}  // namespace cpprun::launcher
