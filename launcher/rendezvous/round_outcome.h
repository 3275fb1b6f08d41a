// What follows when a round ends or a node is lost: finish, end the job, restart (counted against
// --max_restarts) or gather again after a membership change (Note [Elastic rounds]), as pure
// decisions on the host's round (round_state.h), so each rule is unit-tested without a socket. The
// clock (the restart backoff, --shutdown_timeout for stopping) is the host's step's (round_decide.h),
// as it is told the time; the host (rendezvous_host.cpp) waits on its links and carries the step out.
#pragma once

#include <string>

#include "command_line/rendezvous_settings.h"
#include "rendezvous/round_state.h"

namespace cpprun::launcher {

// The host's next step once its own attempt is over (NodeRendezvous::decide), taken again after
// each piece of news until it is not kWait or kAwaitStopped.
enum class AfterAttempt {
  kWait,          // the round has not ended: some node's workers still run (or the host's own)
  kFinish,        // every node's workers succeeded: every agent exits 0
  kEndJob,        // a job-ending signal, or a worker failed with no restart left: exit with the decisive end
  kAwaitStopped,  // the round ended: every node must report its workers stopped first
  kRestart,       // every node stopped after a worker failure: the next round, after the backoff, counted
  kChange,        // every node stopped after a membership change: the next round at once, not counted
};
AfterAttempt after_attempt(const RendezvousSettings& settings, const RoundState& state);

// Once every node stopped: whether enough nodes remain (those still here, the host, and those
// queued) for another round. `reason`: why the job ends, after the decisive end's `ended` text.
struct NextRound {
  bool goes_on = true;
  bool counts_restart = false;  // a worker failure's restart: TORCHELASTIC_RESTART_COUNT goes up
  std::string reason;           // when !goes_on
};
NextRound next_round(const RendezvousSettings& settings, const RoundState& state, const std::string& ended);

// A member's link ended (its agent died, or it broke the protocol) while it had `progress`.
enum class Loss {
  kBeforeRound,  // the round was being gathered: it is not counted, and the last call may close
  kLetGo,        // its workers had all succeeded: it did its part, the others go on
  kEndsRound,    // its workers ran (or were stopping): the round ends as a membership change
};
Loss decide_loss(const RoundState& state, MemberProgress progress);

}  // namespace cpprun::launcher
