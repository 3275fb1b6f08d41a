// The rendezvous host's round, as plain data: what its rules (admission.h, round_window.h) decide
// from. Apart from the host (rendezvous_host.cpp), which holds the links and does the sending and
// printing, so that every rule is unit-tested without a socket, as torchelastic's dynamic
// rendezvous separates its state from its handlers. For now the host builds it from its members
// when a rule is asked; the rules of loss and restarts still read the host's own fields.
#pragma once

#include <string>
#include <vector>

namespace cpprun::launcher {

enum class RoundPhase {
  kGathering,  // nodes join the round being gathered
  kRunning,    // the round's workers run; a newcomer waits for the next round
};

// One of the round's nodes other than the host.
struct RoundMember {
  int node_rank = -1;  // static: its --node_rank; c10d: -1 (numbered when the round starts)
  std::string peer;    // its address, as errors name it: "10.0.0.2:41234"
};

struct RoundState {
  RoundPhase phase = RoundPhase::kGathering;
  int round = 0;
  std::vector<RoundMember> members;  // the round's nodes but the host
  int queued = 0;                    // nodes waiting for the next round
  bool ending = false;               // the running round is over: its end was told to the nodes
  bool anyone_done = false;          // a node of the round (the host included) has all its workers succeeded

  int count() const { return 1 + static_cast<int>(members.size()); }  // the host too
};

}  // namespace cpprun::launcher
