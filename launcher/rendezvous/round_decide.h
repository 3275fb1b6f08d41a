// The rendezvous host's one front door for its decisions: decide_round(settings, state, event, now)
// takes what the host heard (a hello, a member's message, a lost link, its own attempt's end, a
// signal, the clock) and returns what to do (send, admit, refuse, start a round, declare a node lost,
// restart after the backoff, end the job, print a line) and when to wake it next. It changes the
// host's RoundState (round_state.h) itself and does no I/O, reads no clock and prints nothing, so a
// unit test drives whole jobs through it without a socket or a sleep (test_round_decide.cpp). It
// delegates to the rules: admission.h, round_window.h, round_plan.h, round_outcome.h.
//
// This is torchelastic's dynamic_rendezvous.py shape: a plain state, a handler that decides from it
// and the time, and an executor -- RendezvousHost (rendezvous_host.cpp) -- that polls, turns what it
// hears into events, calls decide_round and carries the actions out in order. Unlike torchelastic's
// handlers, which return one action for the executor to apply to the state, the step changes the
// state itself: one event here can change several nodes at once (a round starts, the stop deadline
// passes for two nodes), and the executor then holds no rule of how.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "command_line/rendezvous_settings.h"
#include "diagnosis/node_evidence.h"
#include "rendezvous/node_messages.h"
#include "rendezvous/round_state.h"
#include "rendezvous/round_window.h"
#include "workers/rank_layout.h"

namespace cpprun::launcher {

// Past --shutdown_timeout, how long a node may take to report its workers stopped before it is lost.
inline constexpr std::chrono::seconds kStopSlack{30};

// What the host heard.
struct RoundEvent {
  enum class Kind {
    kJoin,            // join(): the host begins gathering the job's first round; `since`: when it began
    kWake,            // between two polls: the clock ran on, or news came; what follows, if anything
    kHello,           // a new link's first message, `message` (normally a hello), from `peer`
    kMessage,         // node `id` said `message` (done, failed, stopped, evidence; not the tunnel's kinds)
    kLinkLost,        // node `id`'s link ended: `why` ("is gone: ...", a violation, a stalled queue)
    kStoreOpened,     // the round's store keeper asked for (kOpenStore) listens at `store_address`:`store_port`
    kStoreFailed,     // it could not start: `end`
    kKeeperEnded,     // the round's store keeper ended: `end` names it
    kOwnDone,         // the host's workers all succeeded (report_done)
    kOwnFailed,       // one of the host's workers failed: `end` (report_failed); the job ends if not end.restartable
    kOwnInterrupted,  // the host's agent got a job-ending signal while its workers ran: `end`
    kOwnAttemptOver,  // the host's workers finished or were stopped: it waits for the job's decision
    kSignal,          // a job-ending `signal` came while the host waited (join(), decide())
  };
  Kind kind = Kind::kWake;
  int id = 0;
  std::string peer;
  const NodeMessage* message = nullptr;  // kHello, kMessage: the caller's, for the call only
  std::string why;
  JobEnd end;
  int signal = 0;
  RoundTime since{};
  std::string store_address;  // "" when the store is reached directly (--no_job_secret)
  int store_port = 0;

  static RoundEvent join(RoundTime since);
  static RoundEvent wake();
  static RoundEvent hello(std::string peer, const NodeMessage& message);
  static RoundEvent said(int id, const NodeMessage& message);
  static RoundEvent link_lost(int id, std::string why);
  static RoundEvent store_opened(std::string address, int port);
  static RoundEvent of(Kind kind, JobEnd end = {});  // kStoreFailed, kKeeperEnded, kOwn*
  static RoundEvent signalled(int signal);
};

// What the host is to do, in order.
struct RoundAction {
  enum class Kind {
    kAdmit,           // the link just heard (kHello) is node `id` from now on, a member or queued
    kRefuse,          // the link just heard is told `message` (an exit) and closed once that is written
    kDrop,            // node `id` is gone: its link and its tunnel close
    kSend,            // `message` to node `id` (a member or a queued node)
    kBroadcast,       // `message` to every member, and to every queued node too when `to_queued`
    kPrint,           // `line` on the console (stderr), with a newline
    kNodeGone,        // for the diagnosis: group rank `group_rank` is gone; `line` says how
    kKeepEvidence,    // the evidence message just heard (kMessage) from node `id` is the round's
    kOpenStore,       // start the round's store keeper, then tell the step kStoreOpened or kStoreFailed
    kServeStore,      // node `id`'s tunnel connects round `round`'s channels to the store at `store_*`
    kEndStoreRound,   // every member's tunnel closes round `round`'s channels, and the keeper stops
    kStopStore,       // the keeper stops: no worker needs the store any more
    kCollectLate,     // the host's workers succeeded, another's failed: collect the others' evidence, then kWake
    // The wait is over (the last action of its list):
    kRunRound,  // the round starts: the host's workers run `layout`; the diagnosis expects `slices`
    kFinish,    // every node's workers succeeded: the job ends with 0
    kEndJob,    // the job ends with `end`
    kFail,      // the rendezvous failed: throw RendezvousError(end.reason, end.exit_code)
  };
  Kind kind = Kind::kPrint;
  int id = 0;
  NodeMessage message{};
  bool to_queued = false;
  std::string line;
  int group_rank = -1;
  int round = 0;
  std::string store_address;
  int store_port = 0;
  RankLayout layout{};
  std::vector<NodeSlice> slices;
  JobEnd end;

  bool ends_wait() const {
    return kind == Kind::kRunRound || kind == Kind::kFinish || kind == Kind::kEndJob || kind == Kind::kFail;
  }
};

struct RoundActions {
  std::vector<RoundAction> actions;
  // When the host is to step on kWake at the latest, should no news come first (the gathering
  // window, the stop deadline, the backoff's due time); nullopt: only news.
  std::optional<RoundTime> wake_at;
};

// The step. Only kJoin, kWake, kSignal, kStoreOpened and kStoreFailed end a wait (RoundAction::ends_wait).
RoundActions decide_round(const RendezvousSettings& settings, RoundState& state, const RoundEvent& event,
                          RoundTime now);

// Note [Diagnosis on request across nodes]: the members (ids) a `cpprun --diagnose` request on the
// host is sent to: those whose workers run. nullopt: no request is opened, as no round runs, the
// running one has ended, or the host is alone.
std::optional<std::vector<int>> evidence_askees(const RoundState& state);

// How the console and the members name a node: "the agent of node 1 (10.0.0.2:41234)" once it has a
// rank, else "the agent at 10.0.0.2:41234".
std::string describe_member(const RoundMember& member);

}  // namespace cpprun::launcher
