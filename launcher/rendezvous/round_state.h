// The rendezvous host's round, as plain data: what its rules (admission.h, round_window.h,
// round_plan.h, round_outcome.h) decide from. Apart from the host (rendezvous_host.cpp), which holds the links and
// does the sending and printing, so that every rule is unit-tested without a socket, as
// torchelastic's dynamic rendezvous separates its state from its handlers. For now the host builds
// it from its members each time a rule is asked.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "command_line/rendezvous_settings.h"

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

// One of the round's nodes other than the host.
struct RoundMember {
  int node_rank = -1;  // static: its --node_rank; c10d: -1 (numbered when the round starts)
  std::string peer;    // its address, as errors name it: "10.0.0.2:41234"
  MemberProgress progress = MemberProgress::kJoined;
  NodeShape shape{};  // its --nproc_per_node and --role, from its hello
};

struct RoundState {
  RoundPhase phase = RoundPhase::kGathering;
  int round = 0;
  int restart_count = 0;             // restarts after worker failures so far (TORCHELASTIC_RESTART_COUNT)
  std::vector<RoundMember> members;  // the round's nodes but the host
  int queued = 0;                    // nodes waiting for the next round
  bool ending = false;               // the running round is over: its end was told to the nodes
  RoundEnd why = RoundEnd::kNone;    // the reason that decides what follows (outranks())
  bool self_done = false;            // the host's own workers all succeeded this round

  int count() const { return 1 + static_cast<int>(members.size()); }  // the host too
  bool all_members(MemberProgress progress) const {
    return std::all_of(members.begin(), members.end(), [&](const RoundMember& m) { return m.progress == progress; });
  }
  // A node of the round (the host included) whose workers all succeeded: the job is finishing.
  bool anyone_done() const {
    return self_done || std::any_of(members.begin(), members.end(),
                                    [](const RoundMember& m) { return m.progress == MemberProgress::kDone; });
  }
};

}  // namespace cpprun::launcher
