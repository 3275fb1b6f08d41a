// Unit tests of what follows a round's end or a node's loss (rendezvous/round_outcome.h), without a
// socket: finishing, ending the job, restarts counted against --max_restarts, membership changes
// that are not, too few nodes left, and which end decides.
#include "catch.h"

#include <string>

#include "rendezvous/round_outcome.h"

using namespace cpprun::launcher;

namespace {

RendezvousSettings job(int min_nodes, int max_nodes, int max_restarts) {
  RendezvousSettings s;
  s.backend = RendezvousBackend::kC10d;
  s.min_nodes = min_nodes;
  s.max_nodes = max_nodes;
  s.max_restarts = max_restarts;
  return s;
}

// A running round of the host and `progress.size()` members.
RoundState round_of(std::initializer_list<MemberProgress> progress) {
  RoundState state;
  state.phase = RoundPhase::kRunning;
  for (MemberProgress p : progress) state.members.push_back({-1, "10.0.0.9:4000", p});
  return state;
}

RoundState ended(RoundState state, RoundEnd why) {
  state.end = JobEnd{};
  state.why = why;
  return state;
}

}  // namespace

TEST_CASE("round_outcome: the job finishes when the host's and every member's workers succeeded", "[round_outcome]") {
  const RendezvousSettings s = job(1, 3, 0);
  RoundState state = round_of({MemberProgress::kDone, MemberProgress::kDone});
  CHECK(after_attempt(s, state) == AfterAttempt::kWait);  // the host's own are not done yet
  state.self_done = true;
  CHECK(after_attempt(s, state) == AfterAttempt::kFinish);
  state.members[1].progress = MemberProgress::kRunning;
  CHECK(after_attempt(s, state) == AfterAttempt::kWait);  // the exit barrier: one still runs
}

TEST_CASE("round_outcome: a worker failure restarts every node once all stopped, while restarts remain",
          "[round_outcome]") {
  const RendezvousSettings s = job(2, 2, 1);
  RoundState state = ended(round_of({MemberProgress::kRunning}), RoundEnd::kWorkerFailed);
  CHECK(after_attempt(s, state) == AfterAttempt::kAwaitStopped);
  state.members[0].progress = MemberProgress::kStopped;
  CHECK(after_attempt(s, state) == AfterAttempt::kRestart);
  const NextRound next = next_round(s, state, "rank 1 exited with code 3");
  CHECK(next.goes_on);
  CHECK(next.counts_restart);
}

TEST_CASE("round_outcome: a worker failure with no restart left ends the job at once", "[round_outcome]") {
  const RendezvousSettings s = job(2, 2, 1);
  RoundState state = ended(round_of({MemberProgress::kRunning}), RoundEnd::kWorkerFailed);
  state.restart_count = 1;  // --max_restarts=1 spent
  CHECK(after_attempt(s, state) == AfterAttempt::kEndJob);  // not waiting for the nodes to stop
  const RendezvousSettings none = job(2, 2, 0);
  CHECK(after_attempt(none, ended(round_of({MemberProgress::kStopped}), RoundEnd::kWorkerFailed)) ==
        AfterAttempt::kEndJob);
}

TEST_CASE("round_outcome: a job-ending signal ends the job whatever the restarts left", "[round_outcome]") {
  const RendezvousSettings s = job(1, 3, 5);
  CHECK(after_attempt(s, ended(round_of({MemberProgress::kRunning}), RoundEnd::kFatal)) == AfterAttempt::kEndJob);
}

TEST_CASE("round_outcome: a membership change gathers again once all stopped, not counted", "[round_outcome]") {
  const RendezvousSettings s = job(1, 3, 0);  // no restarts at all: a change is not one
  for (RoundEnd why : {RoundEnd::kNodeJoined, RoundEnd::kNodeLost}) {
    RoundState state = ended(round_of({MemberProgress::kStopped, MemberProgress::kRunning}), why);
    CHECK(after_attempt(s, state) == AfterAttempt::kAwaitStopped);
    state.members[1].progress = MemberProgress::kStopped;
    CHECK(after_attempt(s, state) == AfterAttempt::kChange);
    const NextRound next = next_round(s, state, "");
    CHECK(next.goes_on);
    CHECK_FALSE(next.counts_restart);
  }
}

TEST_CASE("round_outcome: below MIN nodes the job cannot go on; queued nodes count", "[round_outcome]") {
  const RendezvousSettings s = job(3, 4, 0);
  RoundState state = ended(round_of({MemberProgress::kStopped}), RoundEnd::kNodeLost);  // host + 1: 2 of MIN 3
  const NextRound next = next_round(s, state, "the agent of node 2 is gone");
  CHECK_FALSE(next.goes_on);
  CHECK(next.reason == "the agent of node 2 is gone; only 2 nodes remain, fewer than the 3 that --nnodes=3:4 needs, "
                       "so the job cannot go on");
  state.queued.resize(1);  // a newcomer waiting for the next round makes up the number
  CHECK(next_round(s, state, "").goes_on);
  RoundState alone = ended(round_of({}), RoundEnd::kNodeLost);
  CHECK(next_round(s, alone, "x").reason == "x; only 1 node remains, fewer than the 3 that --nnodes=3:4 needs, so the "
                                            "job cannot go on");
}

TEST_CASE("round_outcome: a lost node: before its round, after its workers succeeded, while they ran",
          "[round_outcome]") {
  RoundState gathering;
  CHECK(decide_loss(gathering, MemberProgress::kJoined) == Loss::kBeforeRound);
  const RoundState running = round_of({MemberProgress::kRunning});
  CHECK(decide_loss(running, MemberProgress::kDone) == Loss::kLetGo);
  CHECK(decide_loss(running, MemberProgress::kRunning) == Loss::kEndsRound);
  CHECK(decide_loss(running, MemberProgress::kStopped) == Loss::kEndsRound);  // gone before the next round
}

TEST_CASE("round_outcome: which end decides: fatal over a loss over a failure or a join", "[round_outcome]") {
  CHECK(outranks(RoundEnd::kWorkerFailed, RoundEnd::kNone));
  CHECK(outranks(RoundEnd::kNodeLost, RoundEnd::kWorkerFailed));  // a failure caused by the loss is not counted
  CHECK(outranks(RoundEnd::kNodeLost, RoundEnd::kNodeJoined));
  CHECK(outranks(RoundEnd::kFatal, RoundEnd::kNodeLost));
  CHECK_FALSE(outranks(RoundEnd::kNodeJoined, RoundEnd::kWorkerFailed));  // a tie: the first stays
  CHECK_FALSE(outranks(RoundEnd::kWorkerFailed, RoundEnd::kNodeJoined));
  CHECK_FALSE(outranks(RoundEnd::kNodeLost, RoundEnd::kFatal));
}
