// The rendezvous host's round, as plain data: the one state the host keeps, which its step
// (round_decide.h) changes and its rules (admission.h, round_window.h, round_plan.h, round_outcome.h)
// decide from. Apart from the host's I/O (rendezvous_host.cpp: the links, the store keeper, the
// console), so that every rule is unit-tested without a socket or a sleep, as torchelastic's dynamic
// rendezvous separates its state from the handlers that decide and the executor that does the I/O.
//
// Note [The host's state and its links]
// The host keeps one RoundState and, beside it, each node's I/O handles (its NodeLink and StoreTunnel)
// in a map keyed by RoundMember::id. Only the step adds or removes a node (in members or queued), and
// it says so in the same step with a kAdmit or kDrop action, which the host carries out before any
// other: so every id in members and queued has exactly one entry in the map, and the map has no other.
// A node that moves from the queue into a round keeps its id, so nothing moves in the map; the host
// walks the state (members, then queued) to reach its links in the state's order.
#pragma once

#include <algorithm>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "command_line/rendezvous_settings.h"
#include "rendezvous/node_messages.h"
#include "rendezvous/round_window.h"
#include "workers/restart_backoff.h"

namespace cpprun::launcher {

enum class RoundPhase {
  kGathering,  // nodes join the round being gathered
  kRunning,    // the round's workers run; a newcomer waits for the next round
};

// How far a member's workers are in the running round.
enum class MemberProgress {
  kJoined,   // in the round being gathered
  kRunning,  // its workers run this round
  kDone,     // its workers all succeeded this round
  kStopped,  // its workers of this round are stopped
};

// Why the running round ended. The first reason is what the nodes are told; a stronger one that
// comes later decides what happens next (a worker failing because a node died is the node's loss,
// not a failure to count against --max_restarts): see outranks().
enum class RoundEnd {
  kNone,
  kWorkerFailed,  // a restart, counted against --max_restarts
  kNodeJoined,    // a membership change: a node came while the job had room
  kNodeLost,      // a membership change: a node left while its workers ran
  kFatal,         // an agent got a job-ending signal: the job ends
};

// Whether `incoming` decides over `current`: fatal over a loss over a failure or a join (which tie,
// so the first of those stays).
inline bool outranks(RoundEnd incoming, RoundEnd current) {
  constexpr int kStrength[] = {0, 1, 1, 2, 3};  // in RoundEnd's order
  return kStrength[static_cast<int>(incoming)] > kStrength[static_cast<int>(current)];
}

// What follows the host's own attempt (round_outcome.h defines it): the step holds one while it
// collects late evidence.
enum class AfterAttempt;

// One of the job's nodes other than the host: a member of the round, or a node queued for the next.
struct RoundMember {
  int node_rank = -1;  // static: its --node_rank; c10d: -1 (numbered when the round starts)
  std::string peer;    // its address, as errors name it: "10.0.0.2:41234"
  MemberProgress progress = MemberProgress::kJoined;
  NodeShape shape{};    // its --nproc_per_node and --role, from its hello
  int id = 0;           // the host's name for it, from 1, never reused: Note [The host's state and its links]
  int group_rank = -1;  // in the running round; -1 before it got one
};

struct RoundState {
  RoundPhase phase = RoundPhase::kGathering;
  int round = 0;
  int restart_count = 0;              // restarts after worker failures so far (TORCHELASTIC_RESTART_COUNT)
  std::vector<RoundMember> members;   // the round's nodes but the host: in join order (c10d), by --node_rank (static)
  std::vector<RoundMember> queued;    // c10d: arrived while a round ran (or the job was full), in arrival order
  std::set<int> ever_joined;          // static: the node ranks that ever joined, for the join time-out's message
  int next_id = 1;                    // the next admitted node's RoundMember::id

  // How the running round ends.
  std::optional<JobEnd> end;         // the first end: told to the nodes (the attempt ended)
  RoundEnd why = RoundEnd::kNone;    // the reason that decides what follows (outranks())
  JobEnd decisive;                   // the end of that reason: the job's, should it end
  bool self_done = false;            // the host's own workers all succeeded this round
  bool own_over = false;             // the host's own attempt is over: it waits for the job's decision
  bool late_checked = false;         // the others' evidence was collected for a done host this round
  std::optional<AfterAttempt> held;  // decided before that collection, carried out after it
  // The job's end decided while a round after the first is gathered (a node of the job lost below
  // MIN, a member's job-ending signal): carried out at the next wake, as only a wake ends a wait.
  std::optional<JobEnd> gathering_ended;

  // The clocks, as the step was told them (it never reads one).
  RoundTime join_deadline{};              // gathering: --rdzv_conf join_timeout from when it began
  std::optional<RoundTime> last_call;     // gathering: torchrun's last call (round_window.h)
  RoundTime attempt_started{};            // when the running round started: a long one resets the backoff
  std::optional<RoundTime> stop_deadline;  // the nodes must report their workers stopped by then
  std::optional<RoundTime> restart_at;    // the backoff's due time for the next round, once decided
  RestartBackoff backoff;                 // the job's --restart_backoff, set when the job begins

  int count() const { return 1 + static_cast<int>(members.size()); }  // the host too
  bool ending() const { return end.has_value(); }                      // the running round is over
  bool all_members(MemberProgress progress) const {
    return std::all_of(members.begin(), members.end(), [&](const RoundMember& m) { return m.progress == progress; });
  }
  // A node of the round (the host included) whose workers all succeeded: the job is finishing.
  bool anyone_done() const {
    return self_done || std::any_of(members.begin(), members.end(),
                                    [](const RoundMember& m) { return m.progress == MemberProgress::kDone; });
  }
  // The members whose workers all succeeded this round, by group rank: they have no evidence to send.
  std::vector<int> done_group_ranks() const {
    std::vector<int> done;
    for (const RoundMember& m : members) {
      if (m.progress == MemberProgress::kDone && m.group_rank >= 0) done.push_back(m.group_rank);
    }
    return done;
  }
  // The member, or else queued node, with `id`; nullptr if neither has it.
  const RoundMember* find(int id) const {
    for (const std::vector<RoundMember>* nodes : {&members, &queued}) {
      const auto it = std::find_if(nodes->begin(), nodes->end(), [&](const RoundMember& m) { return m.id == id; });
      if (it != nodes->end()) return &*it;
    }
    return nullptr;
  }
};

}  // namespace cpprun::launcher
