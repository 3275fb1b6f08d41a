// Rendezvous between the agents of a multi-node job: one state machine for both backends, as
// torchrun has one agent. One agent hosts it (RendezvousHost), the others join it (RendezvousMember).
// c10d (--nnodes=MIN:MAX): the agent that can listen at --rdzv_endpoint hosts and numbers the nodes
// as they join. static (--nnodes=K): the same with MIN = MAX = K, hosted by node 0, each node's rank
// fixed by --node_rank. Either numbers the workers across nodes, stops every node when one fails,
// restarts all together, and lets no node exit before the others are done (torchrun's exit barrier).
//
// Note [Why links and not store keys]
// torchrun's agents rendezvous through store keys. Ours only find each other there (node 0
// publishes a port) and then talk over one TCP link per member (node_link.h): a c10d store cannot
// tell node 0 that an agent died, wait for the first of several keys, or be interrupted by Ctrl-C,
// and it is recreated each round (Note [Agent store]). A link's end shows in poll() the moment an
// agent is killed, in the loop that already watches the workers and the signals.
//
// Note [Elastic rounds]
// The host gathers each round anew: round 0 completes when MAX nodes joined, or MIN joined and
// --rdzv_conf last_call_timeout passed since the MIN-th came (torchrun's rule). Nodes are numbered
// in join order, the host first. A round ends when a worker fails (counted against --max_restarts),
// or on a membership change, which is not counted and keeps TORCHELASTIC_RESTART_COUNT: a node
// joining a job below MAX, or a node lost (a worker failing in the same round is taken for the
// loss's consequence). A node that comes while the job runs at MAX or is finishing waits for the
// next round. A loss that leaves fewer than MIN ends the job; a lost node whose workers all
// succeeded is let go. Losing the host's agent loses the rendezvous: the members fail, as torchrun's
// do when the c10d store's host dies. static is the same with MIN = MAX, so a lost node ends the
// job and a latecomer is refused (its --node_rank is taken).
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
#include "workers/attempt.h"

namespace cpprun::launcher {

// The rendezvous failed (a node never came, nodes disagree, node 0 is unreachable); the message
// says which nodes and what to do, and the agent exits with exit_code().
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
  // Waits for the rendezvous and returns this node's first round. Throws RendezvousError after
  // --rdzv_conf join_timeout; returns nullopt on a job-ending signal, given in `signal`.
  virtual std::optional<RankLayout> join(SignalRelay& relay, int& signal) = 0;

  // The round being run: every restart and (c10d) every membership change starts one.
  virtual int round() const = 0;
  // TORCHELASTIC_RESTART_COUNT: the restarts after worker failures so far.
  virtual int restart_count() const = 0;
  // Why another node ended the attempt; valid once attempt_ended().
  virtual const JobEnd& peer_end() const = 0;

  // This node's attempt is over; each tells the other nodes at once, before workers are stopped.
  virtual void report_done() = 0;                          // every local worker succeeded
  virtual void report_failed(const JobEnd& end) = 0;       // a local worker failed
  virtual void report_interrupted(const JobEnd& end) = 0;  // this agent got a job-ending signal; it exits

  // Once this node's workers have finished or been stopped (not after report_interrupted): waits
  // for the job's decision; a done node waits here until every node is (the exit barrier).
  virtual JobDecision decide(SignalRelay& relay) = 0;
};

// Finds this agent's side (rendezvous_claim.cpp) and connects it. Returns nullptr when a
// job-ending signal (in `signal`) came first. Throws RendezvousError.
std::unique_ptr<NodeRendezvous> open_rendezvous(const RendezvousSettings& settings, SignalRelay& relay, int& signal);

// The two sides. `started` is when the agent began to look for the rendezvous: join_timeout counts
// from there.
std::unique_ptr<NodeRendezvous> make_rendezvous_host(const RendezvousSettings& settings, LinkListener listener,
                                                     std::chrono::steady_clock::time_point started);
std::unique_ptr<NodeRendezvous> make_rendezvous_member(const RendezvousSettings& settings, NodeLink link,
                                                       std::chrono::steady_clock::time_point started);

// The key under which node 0 publishes the port of its LinkListener. See Note [Agent store].
inline constexpr const char* kLinkPortKey = "agent/link_port";
// The agent store's timeout for connecting and reading a key; node 0 is known to be up by then.
inline constexpr std::chrono::milliseconds kStoreTimeout{30000};

// The job-ending signal among the pending ones, or 0; the others are dropped, as no worker runs
// while the agents rendezvous or decide.
int take_ending_signal(SignalRelay& relay);

// Waits up to timeout_ms for a signal or for data on `fds`. Returns the job-ending signal if one
// came (links unread); else calls on_readable(fd) for each readable fd and returns 0.
int poll_links(SignalRelay& relay, const std::vector<int>& fds, int timeout_ms,
               const std::function<void(int)>& on_readable);

// Why the rendezvous timed out. static: the node ranks that `never` came, and those that came and
// `left` again; c10d: how many nodes `joined`. `source` follows the counts, e.g. " (as node 0 last
// reported)" in a member, which repeats what the host last told it.
std::string join_timeout_message(const RendezvousSettings& settings, const std::vector<int>& never,
                                 const std::vector<int>& left, int joined, const std::string& source);

// Milliseconds from now until `when`, for poll(): 0 once it has passed.
int ms_until(std::chrono::steady_clock::time_point when);

// "the agent of node 1 (10.0.0.2:41234)"; without the address when `peer` is empty.
std::string describe_agent(int node_rank, const std::string& peer);
// "rank 4", "ranks 4-7": a node's workers.
std::string rank_range(int base_rank, int local_world_size);
// "3 s", "0.5 s"
std::string seconds_text(std::chrono::milliseconds ms);

}  // namespace cpprun::launcher
