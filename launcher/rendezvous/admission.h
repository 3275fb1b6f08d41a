// Whether an agent that introduced itself joins the job, and how: torchrun's rules and cpprun's
// checks of the nodes' settings, as a pure decision on the host's round (round_state.h). The host's
// step (round_decide.h) asks it and says what to send and print; this file only decides, so each
// rule is unit-tested without a socket.
#pragma once

#include <string>

#include "command_line/rendezvous_settings.h"
#include "rendezvous/node_messages.h"
#include "rendezvous/round_state.h"

namespace cpprun::launcher {

struct Admission {
  enum class Kind {
    kRefuse,  // the agent is told `reason` and exits 2; the host warns
    kJoin,    // into the round being gathered
    kQueue,   // waits for the next round (c10d): a round runs, or the job has MAX nodes
  };
  Kind kind = Kind::kJoin;
  // kRefuse: why, naming the option to fix ("it has --rdzv_id=b but node 0 has --rdzv_id=a; ...").
  // kQueue without taken_in: why it waits ("the job is finishing", "the job runs at its maximum of --nnodes=1:2").
  std::string reason;
  // kQueue: the job has room and is not finishing, so the running round ends for it (torchrun's
  // agents restart for a newcomer; not counted against --max_restarts): the node's `queued` says so.
  bool taken_in = false;
  // kQueue with taken_in: this newcomer ends the running round (false when it is already ending).
  bool ends_round = false;
};

// The decision on the agent whose first message is `introduction`. In order: it must introduce
// itself, speak this protocol, and have this job's --rdzv_backend, --rdzv_id, --nnodes and
// --max_restarts; static: a --node_rank from 1 to --nnodes - 1 that no node holds, while the round
// is gathered. Then it joins the round being gathered while there is room, else waits (c10d).
Admission decide_admission(const RendezvousSettings& settings, const RoundState& state,
                           const NodeMessage& introduction);

}  // namespace cpprun::launcher
