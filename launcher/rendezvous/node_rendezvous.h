// Rendezvous between the agents of a multi-node job: one state machine for both backends, as
// torchrun has one agent. One agent hosts it (RendezvousHost; which one: node_rendezvous.cpp), the
// others join it (RendezvousMember). It numbers the workers across nodes, stops every node when one
// fails, restarts all together, and lets no node exit before the others are done (the exit barrier).
//
// Note [Why links and not store keys]
// torchrun's agents rendezvous through the keys of a c10d store that node 0 (static) or the endpoint's
// host (c10d) serves; ours talk over one TCP link per member (node_link.h) to the agent listening at
// --master_port (static) or --rdzv_endpoint (c10d). A c10d store cannot tell the host that an agent
// died, wait for the first of several keys, or be interrupted by Ctrl-C; a link's end shows at once
// in the poll() that already watches the workers and signals. And the agents need no LibTorch: a
// static agent starts in milliseconds, as a single-node one does.
//
// Note [Workers' store]
// The workers' c10d store is a separate one, hosted by the agent that hosts the rendezvous, as
// torchrun's agent hosts it (TORCHELASTIC_USE_AGENT_STORE=True, which cpprun::init_process_group()
// and torch's env:// both honour: every rank connects as a client): at the start of each round it
// binds a new socket on a port the kernel picks (--master_port is the agents') and hands it to that
// round's store keeper, a process serving LibTorch's own TCPStore on it (Note [Store keeper] in
// store_keeper_plan.h), which it stops once the round is over on every node. A new store each round:
// a restarted worker never sees the previous round's keys. With a job secret the socket is on the
// host's loopback alone, and the other nodes' workers reach it only through their agent and the link
// (Note [Store tunnel wired] in store_tunnel_io.h); with --no_job_secret on every interface. A keeper
// that ends while the round's workers run ends the job (RoundEnd::kFatal), naming it.
//
// Note [Elastic rounds]
// The host gathers each round anew: round 0 completes when MAX nodes joined, or MIN joined and
// --rdzv_conf last_call_timeout passed since the MIN-th came (torchrun's rule). Nodes are numbered
// in join order, the host first. A round ends when a worker fails (counted against --max_restarts)
// or on a membership change, not counted: a node joining a job below MAX, or a node lost (a worker
// failing in that round is taken for the loss's consequence). A node that comes while the job runs
// at MAX or is finishing waits for the next round. A loss that leaves fewer than MIN ends the job; a
// lost node whose workers all succeeded is let go. Losing the host's agent loses the rendezvous, as
// torchrun's members fail when the c10d store's host dies. static is this with MIN = MAX: a lost
// node ends the job and a latecomer is refused (its --node_rank is taken).
//
// Note [One diagnosis for several nodes]
// When a round ends badly (a worker failed here, or another node ended it), every agent gathers its
// own ranks' flight-recorder dumps before stopping its workers (run_attempt), and a member sends them
// at once to the host, one evidence message per rank (node_messages.h). The host reads its links
// while it gathers and stops its own workers, then waits up to kEvidenceWait more for the nodes it has
// not heard from in full -- never for a node whose workers had all succeeded (it has nothing to send)
// or whose agent is gone -- and prints one diagnosis over every rank of the job, naming the ranks it
// heard nothing of ("node 1 sent no evidence within 5 s"), and writes it to its log dir as JSON. A
// member prints one line saying that node 0 has it; it prints its own part only when node 0 will
// not diagnose (its link to node 0 is gone, or node 0's agent ended the job on a signal), so its
// evidence is still seen. One screen is the point: a member's part alone
// shows its ranks waiting, not for whom. When the host's own workers had all succeeded before
// another node failed, its run_attempt reports nothing: the host collects the others' evidence in
// decide() instead, once the round is known to have failed (take_late_evidence()).
//
// Note [Diagnosis on request across nodes]
// `cpprun --diagnose` with the host's pid asks every node while the job goes on. The host numbers the
// request (from 1, for the whole job), sends `ask ROUND R` to each member whose workers run, and
// gathers its own ranks' dumps meanwhile; each member, between its workers' events (run_attempt),
// gathers its ranks' dumps as for a local request and sends them back, one `evidence ROUND R`
// message per rank (the failure path's message and bounds; the failure's own are request 0). The
// host waits up to kEvidenceWait past its own dumps for the nodes that still owe R an answer (never
// for a done or gone node; a failure ending the round, or a signal other than another request,
// cuts the wait short), merges as the failure path does and answers with one diagnosis naming the
// ranks it heard nothing of. Then R is closed: an answer that comes later, or is of another round,
// is set aside by its number (evidence_for(), pure), so a slow node's old answer is never taken for
// a newer request's. A member asked directly answers for its own ranks and says where to ask for
// the whole job: relaying to the host would need the host's answer, every rank's entries, sent
// back over a link whose lines are bounded for one rank's, for what the host's pid gives at once.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "command_line/program_command.h"
#include "command_line/rendezvous_settings.h"
#include "diagnosis/node_evidence.h"
#include "rendezvous/node_link.h"
#include "rendezvous/node_messages.h"
#include "workers/attempt.h"
#include "workers/rank_layout.h"
#include "workers/run_directory.h"
#include "workers/signal_relay.h"
#include "workers/store_keeper_plan.h"
#include "workers/worker_specs.h"

namespace cpprun::launcher {

// The rendezvous failed (a node never came, nodes disagree, node 0 is unreachable): exit with exit_code().
class RendezvousError : public std::runtime_error {
 public:
  RendezvousError(const std::string& message, int exit_code) : std::runtime_error(message), exit_code_(exit_code) {}
  int exit_code() const { return exit_code_; }

 private:
  int exit_code_;
};

// The error an agent exits with when the job ended as `end` said: its reason, with "cpprun: " before
// it as every launcher error has, unless the reason has it already (the host's refusals and timeouts,
// written for the console, do; a reason this agent found itself, such as why its link closed, does not).
RendezvousError job_end_error(const JobEnd& end);

// What getaddrinfo() said about a host name.
struct HostLookup {
  enum class Result {
    kResolved,
    kUnknown,    // the name does not exist (EAI_NONAME, EAI_NODATA, EAI_FAIL): retrying cannot help
    kTemporary,  // the resolver could not answer now (EAI_AGAIN: DNS unreachable, say)
  };
  Result result = Result::kResolved;
  std::string error;  // gai_strerror's text, e.g. "Name or service not known"
};

HostLookup look_up_host(const std::string& host);

// Before anything starts, else a misspelt --master_addr shows only after the join timeout as
// "nothing answered". Throws UsageError if settings.host does not exist; RendezvousError if the
// resolver gave no answer for about 5 s. `look_up` is for tests.
void check_meeting_host_resolves(const RendezvousSettings& settings,
                                 const std::function<HostLookup(const std::string&)>& look_up = look_up_host);

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
  // This machine's end of each link to another node's agent in the round (NodeLink::local_address()):
  // a member's one to the host, the host's to each member. Where this node reaches the rendezvous
  // host from, or is reached at (socket_interface.h).
  virtual std::vector<std::string> link_addresses() const = 0;
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

  // See Note [One diagnosis for several nodes]. Once this node's ranks' evidence is gathered, before
  // its workers are stopped: a member sends it to the host (false if it could not: the link is gone);
  // the host keeps its own.
  virtual bool share_evidence(const std::vector<RankEvidence>& evidence) = 0;
  // The host: waits up to `wait` for the evidence of the nodes not heard from in full (a job-ending
  // signal cuts the wait short and is raised again, for decide()), then merges every node's. A
  // member: nullopt.
  virtual std::optional<MergedEvidence> collect_evidence(SignalRelay& relay, std::chrono::milliseconds wait) = 0;
  // The host, after decide(), when its own workers had all succeeded but another node's failed: the
  // evidence it collected meanwhile (run_attempt had nothing to report here), once. A member: nullopt.
  struct LateEvidence {
    MergedEvidence merged;
    std::string why;  // how the round ended, as the nodes were told
  };
  virtual std::optional<LateEvidence> take_late_evidence() { return std::nullopt; }

 protected:
  // Waits up to timeout_ms for news on poll_fds(), read (and queues written) through on_ready(); returns 0, or the
  // job-ending signal that came first (the links unread).
  int poll_links(SignalRelay& relay, int timeout_ms);
};

// The agent of one node (multi_node_agent.cpp): joins the rendezvous, then runs rounds of this
// node's workers until every node succeeded, the job failed, or its restarts ran out. Returns
// cpprun's exit code. Throws RendezvousError when the nodes cannot meet. `keeper`: the workers' store
// keeper, should this agent host the rendezvous (Note [Workers' store]).
int run_multi_node(const RendezvousSettings& settings, const WorkerSettings& workers, const ProgramCommand& program,
                   const EnvMap& parent_env, const KeeperSettings& keeper, SignalRelay& relay,
                   const RunDirectory& run_dir);

// Finds this agent's side and connects it; nullptr when a job-ending signal (in `signal`) came first.
std::unique_ptr<NodeRendezvous> open_rendezvous(const RendezvousSettings& settings, const KeeperSettings& keeper,
                                                SignalRelay& relay, int& signal);

// The two sides; join_timeout counts from `started`, when the agent began to look for the rendezvous.
std::unique_ptr<NodeRendezvous> make_rendezvous_host(const RendezvousSettings& settings, const KeeperSettings& keeper,
                                                     LinkListener listener, Clock::time_point started);
// `reconnect` opens a new link to the host, or nullopt if it could not by the deadline (or a signal
// came): a member whose link the host drops before the handshake completes (a flood at its port:
// Note [Pending links under a flood]) tries again with it until its join timeout, pausing
// retry_pause() between tries, as while nothing answers at all.
using Reconnect = std::function<std::optional<NodeLink>(Clock::time_point deadline, std::string& error)>;
std::unique_ptr<NodeRendezvous> make_rendezvous_member(const RendezvousSettings& settings, NodeLink link,
                                                       Clock::time_point started, Reconnect reconnect);

// Why the rendezvous timed out. static: the node ranks that `never` came, and those that came and
// `left` again; c10d: how many nodes `joined`. `source` follows, e.g. " (as node 0 last reported)".
std::string join_timeout_message(const RendezvousSettings& settings, const std::vector<int>& never,
                                 const std::vector<int>& left, int joined, const std::string& source);

// Milliseconds from now until `when`, for poll(): 0 once it has passed.
int ms_until(Clock::time_point when);

// How long an agent pauses before its next try to reach the rendezvous host after `tries` failed
// ones (from 0): nothing answered, or the connection was closed before the handshake. 5 ms after the
// first, doubling to 100 ms: agents started together (a job's nodes launched at once, the tests) find
// their host a few milliseconds after it listens, and one waiting longer costs the host, or whatever
// listens at its port, at most ten connections a second.
std::chrono::milliseconds retry_pause(int tries);

// Why an agent's link ended when it sent nothing wrong.
inline constexpr const char* kAgentGone = "is gone: it was killed, or its host or network went down";
// "the agent of node 1 (10.0.0.2:41234)"; without the address when `peer` is empty.
std::string describe_agent(int node_rank, const std::string& peer);
std::string rank_range(int base_rank, int local_world_size);  // a node's workers: "rank 4", "ranks 4-7"
std::string seconds_text(std::chrono::milliseconds ms);       // "3 s", "0.5 s"

}  // namespace cpprun::launcher
