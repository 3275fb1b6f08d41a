// See round_outcome.h.
#include "rendezvous/round_outcome.h"

namespace cpprun::launcher {

AfterAttempt after_attempt(const RendezvousSettings& settings, const RoundState& state) {
  if (!state.ending()) {
    return state.self_done && state.all_members(MemberProgress::kDone) ? AfterAttempt::kFinish : AfterAttempt::kWait;
  }
  if (state.why == RoundEnd::kFatal ||
      (state.why == RoundEnd::kWorkerFailed && state.restart_count >= settings.max_restarts)) {
    return AfterAttempt::kEndJob;
  }
  if (!state.all_members(MemberProgress::kStopped)) return AfterAttempt::kAwaitStopped;
  // Only restarts after a worker failure back off, and count.
  return state.why == RoundEnd::kWorkerFailed ? AfterAttempt::kRestart : AfterAttempt::kChange;
}

NextRound next_round(const RendezvousSettings& settings, const RoundState& state, const std::string& ended) {
  const int available = state.count() + static_cast<int>(state.queued.size());
  if (available < settings.min_nodes) {
    const std::string nodes = std::to_string(available) + (available == 1 ? " node remains" : " nodes remain");
    return {false, false,
            ended + "; only " + nodes + ", fewer than the " + std::to_string(settings.min_nodes) + " that " +
                settings.nnodes_flag() + " needs, so the job cannot go on"};
  }
  return {true, state.why == RoundEnd::kWorkerFailed, ""};
}

Loss decide_loss(const RoundState& state, MemberProgress progress) {
  if (state.phase == RoundPhase::kGathering) return Loss::kBeforeRound;
  // A node whose workers all succeeded has done its part; the others need not start over for it.
  if (progress == MemberProgress::kDone) return Loss::kLetGo;
  return Loss::kEndsRound;
}

}  // namespace cpprun::launcher
