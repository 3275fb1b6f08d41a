// When the host starts a round it gathers: torchrun's MIN:MAX window (Note [Elastic rounds]) as pure
// functions of the count and the clock, so the window is unit-tested without sockets or sleeping.
// The host's step (round_decide.h) asks them and prints; the host polls its links until the time
// they give.
#pragma once

#include <chrono>
#include <optional>

#include "command_line/rendezvous_settings.h"

namespace cpprun::launcher {

using RoundTime = std::chrono::steady_clock::time_point;

struct GatherStep {
  enum class Kind {
    kStart,     // MAX nodes are here, or MIN and the last call passed, or MIN at the join timeout
    kTimedOut,  // --rdzv_conf join_timeout passed with fewer than MIN
    kWait,      // poll until `until` (or news comes)
  };
  Kind kind = Kind::kWait;
  RoundTime until{};
};

// With `count` nodes gathered (the host too), the last call (if open) and the join deadline.
// static is the window MIN = MAX: it starts when every node is here, and never has a last call.
GatherStep gather_step(const RendezvousSettings& settings, int count, std::optional<RoundTime> last_call,
                       RoundTime deadline, RoundTime now);

// The last call once the count changed to `count`: it opens (now + last_call_timeout) when the
// MIN-th node arrives below MAX, stays as it was while the count stays in the window, and closes when
// the nodes drop below MIN again.
std::optional<RoundTime> last_call_after(const RendezvousSettings& settings, int count,
                                         std::optional<RoundTime> last_call, RoundTime now);

}  // namespace cpprun::launcher
