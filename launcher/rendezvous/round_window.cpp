// See round_window.h.
#include "rendezvous/round_window.h"

#include <algorithm>

namespace cpprun::launcher {

GatherStep gather_step(const RendezvousSettings& settings, int count, std::optional<RoundTime> last_call,
                       RoundTime deadline, RoundTime now) {
  if (count >= settings.max_nodes || (last_call && now >= *last_call) ||
      (count >= settings.min_nodes && now >= deadline)) {
    return {GatherStep::Kind::kStart};
  }
  if (now >= deadline) return {GatherStep::Kind::kTimedOut};
  return {GatherStep::Kind::kWait, last_call ? std::min(*last_call, deadline) : deadline};
}

std::optional<RoundTime> last_call_after(const RendezvousSettings& settings, int count,
                                         std::optional<RoundTime> last_call, RoundTime now) {
  if (count < settings.min_nodes) return std::nullopt;
  if (!last_call && count < settings.max_nodes) return now + settings.last_call_timeout;
  return last_call;
}

}  // namespace cpprun::launcher
