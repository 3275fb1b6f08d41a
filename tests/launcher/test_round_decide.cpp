// Unit tests of the rendezvous host's step (rendezvous/round_decide.h), without a socket or a sleep:
// whole jobs driven event by event on a made-up clock, asserting what the host is told to do in
// order -- a static job whose node fails, restarts and then loses a node; a c10d job below MIN, its
// last call, a late joiner taken in (scale-up) and one that waits at MAX; the stop deadline, the
// restart backoff, the late evidence of a done host, refusals and signals.
#include "catch.h"

#include <chrono>
#include <csignal>
#include <stdexcept>
#include <string>
#include <vector>

#include "rendezvous/node_rendezvous.h"
#include "rendezvous/round_decide.h"
#include "rendezvous_jobs.h"

using namespace cpprun::launcher;
using launcher_test::c10d_job;
using launcher_test::static_job;
using std::chrono::milliseconds;
using std::chrono::seconds;

namespace {

// One action as a short word list: what it does and to whom, without texts (printed() has those).
std::string word(const RoundAction& a) {
  const auto message = [](const NodeMessage& m) {
    std::string w = message_word(m.kind);
    if (m.kind == MessageKind::kExit) return w + " " + std::to_string(m.end.exit_code);
    return w + " " + std::to_string(m.round);
  };
  switch (a.kind) {
    case RoundAction::Kind::kAdmit: return "admit #" + std::to_string(a.id);
    case RoundAction::Kind::kRefuse: return "refuse: " + message(a.message);
    case RoundAction::Kind::kDrop: return "drop #" + std::to_string(a.id);
    case RoundAction::Kind::kSend: return "send #" + std::to_string(a.id) + " " + message(a.message);
    case RoundAction::Kind::kBroadcast:
      return std::string(a.to_queued ? "tell all " : "tell members ") + message(a.message);
    case RoundAction::Kind::kPrint: return "print";
    case RoundAction::Kind::kNodeGone: return "gone: group rank " + std::to_string(a.group_rank);
    case RoundAction::Kind::kKeepEvidence: return "evidence #" + std::to_string(a.id);
    case RoundAction::Kind::kOpenStore: return "open store";
    case RoundAction::Kind::kServeStore: return "serve #" + std::to_string(a.id) + " round " + std::to_string(a.round);
    case RoundAction::Kind::kEndStoreRound: return "end store round " + std::to_string(a.round);
    case RoundAction::Kind::kStopStore: return "stop store";
    case RoundAction::Kind::kCollectLate: return "collect late evidence";
    case RoundAction::Kind::kRunRound: return "run round " + std::to_string(a.round);
    case RoundAction::Kind::kFinish: return "finish";
    case RoundAction::Kind::kEndJob: return "end job " + std::to_string(a.end.exit_code);
    case RoundAction::Kind::kFail: return "fail " + std::to_string(a.end.exit_code);
  }
  return "?";
}

using Words = std::vector<std::string>;

Words words(const RoundActions& actions) {
  Words out;
  for (const RoundAction& a : actions.actions) out.push_back(word(a));
  return out;
}

std::vector<std::string> printed(const RoundActions& actions) {
  std::vector<std::string> lines;
  for (const RoundAction& a : actions.actions) {
    if (a.kind == RoundAction::Kind::kPrint) lines.push_back(a.line);
  }
  return lines;
}

// The first action of `kind`; fails the test if there is none.
const RoundAction& first(const RoundActions& actions, RoundAction::Kind kind) {
  for (const RoundAction& a : actions.actions) {
    if (a.kind == kind) return a;
  }
  std::string all;
  for (const std::string& w : words(actions)) all += (all.empty() ? "" : ", ") + w;
  FAIL("no action of the kind asked for among: " + all);
  throw std::logic_error("unreachable");
}

// The host of a job: its settings, its one state, and a clock the test moves.
struct Host {
  explicit Host(RendezvousSettings s) : settings(std::move(s)) {}

  // Every step of every scenario also checks what RendezvousHost relies on: only a step on kJoin or
  // kWake opens a store or collects evidence late (it alone has the signal relay then), and only
  // kJoin, kWake, kSignal, kStoreOpened and kStoreFailed end a wait (round_decide.h).
  RoundActions step(const RoundEvent& event) {
    RoundActions actions = decide_round(settings, state, event, now);
    wake_at = actions.wake_at;
    const bool joins_or_wakes = event.kind == RoundEvent::Kind::kJoin || event.kind == RoundEvent::Kind::kWake;
    const bool may_end_wait = joins_or_wakes || event.kind == RoundEvent::Kind::kSignal ||
                              event.kind == RoundEvent::Kind::kStoreOpened ||
                              event.kind == RoundEvent::Kind::kStoreFailed;
    for (const RoundAction& a : actions.actions) {
      if (!joins_or_wakes && (a.kind == RoundAction::Kind::kOpenStore || a.kind == RoundAction::Kind::kCollectLate)) {
        FAIL("'" + word(a) + "' decided on an event other than kJoin or kWake");
      }
      if (!may_end_wait && a.ends_wait()) FAIL("'" + word(a) + "' ends a wait on an event that cannot end one");
    }
    return actions;
  }
  RoundActions join() { return step(RoundEvent::join(now)); }
  RoundActions wake() { return step(RoundEvent::wake()); }
  RoundActions pass(milliseconds d) {
    now += d;
    return wake();
  }
  // A member agent started with the host's own options; `node_rank` -1 for c10d.
  RoundActions hello(int node_rank, const std::string& peer) {
    const NodeMessage m = NodeMessage::make_hello(launcher_test::hello_like(settings, node_rank));
    return step(RoundEvent::hello(peer, m));
  }
  RoundActions said(int id, const NodeMessage& m) { return step(RoundEvent::said(id, m)); }
  RoundActions store_opened(int port) { return step(RoundEvent::store_opened("127.0.0.1", port)); }
  RoundActions own(RoundEvent::Kind kind, JobEnd end = {}) { return step(RoundEvent::of(kind, std::move(end))); }

  RendezvousSettings settings;
  RoundState state;
  RoundTime now = RoundTime{} + std::chrono::hours(1);
  std::optional<RoundTime> wake_at;
};

const std::string kGone = kAgentGone;

}  // namespace

TEST_CASE("round_decide: exactly kRunRound, kFinish, kEndJob and kFail end a wait", "[round_decide]") {
  using K = RoundAction::Kind;
  for (const K kind : {K::kAdmit, K::kRefuse, K::kDrop, K::kSend, K::kBroadcast, K::kPrint, K::kNodeGone,
                       K::kKeepEvidence, K::kOpenStore, K::kServeStore, K::kEndStoreRound, K::kStopStore,
                       K::kCollectLate, K::kRunRound, K::kFinish, K::kEndJob, K::kFail}) {
    RoundAction a;
    a.kind = kind;
    const bool ends = kind == K::kRunRound || kind == K::kFinish || kind == K::kEndJob || kind == K::kFail;
    CHECK(a.ends_wait() == ends);
  }
}

TEST_CASE("round_decide: a static job of 3 nodes: node 2 fails, all restart after the backoff, then a node is lost",
          "[round_decide]") {
  RendezvousSettings s = static_job(3);
  s.max_restarts = 1;
  s.job_secret = "secret";  // the store is tunnelled: each member's tunnel serves the round
  Host host(s);
  const RoundTime t0 = host.now;

  CHECK(words(host.join()) == Words{"tell members gathering 0"});
  CHECK(host.wake_at == t0 + s.join_timeout);
  CHECK(words(host.hello(2, "10.0.0.3:4000")) == Words{"admit #1", "tell members gathering 0"});
  CHECK(words(host.wake()).empty());
  CHECK(words(host.hello(1, "10.0.0.2:4000")) == Words{"admit #2", "tell members gathering 0"});
  CHECK(words(host.wake()) == Words{"open store"});  // every node is here

  RoundActions started = host.store_opened(5000);
  REQUIRE(words(started) == Words{"serve #2 round 0", "send #2 start 0", "serve #1 round 0", "send #1 start 0",
                                  "print", "run round 0"});
  CHECK(printed(started) ==
        std::vector<std::string>{"cpprun: all 3 nodes joined at 10.0.0.1:29500; 3 workers (node 0: rank 0, node 1: "
                                 "rank 1, node 2: rank 2)"});
  CHECK(started.actions[1].message.layout.group_rank == 1);  // by --node_rank, whatever the order they came in
  CHECK(started.actions[3].message.layout.group_rank == 2);

  // Node 2's worker fails: every member is told, and the host waits for them to stop.
  const JobEnd failed{3, true, "rank 2 (local_rank 0, pid 41) on node 2 exited with code 3"};
  CHECK(words(host.said(1, NodeMessage::make_failed(0, failed))) == Words{"tell members end 0"});
  CHECK(words(host.own(RoundEvent::Kind::kOwnAttemptOver)).empty());
  CHECK(words(host.wake()).empty());
  CHECK(host.wake_at == host.now + s.shutdown_timeout + kStopSlack);
  CHECK(words(host.said(2, NodeMessage::make_stopped(0))).empty());
  CHECK(words(host.wake()).empty());
  host.said(1, NodeMessage::make_stopped(0));
  RoundActions backoff = host.wake();
  CHECK(printed(backoff) ==
        std::vector<std::string>{"cpprun: restarting in 1 s (restart 1 of --max_restarts=1; --restart_backoff=1:30 "
                                 "doubles the wait after each attempt that fails within 30 s, up to 30 s)"});
  CHECK(host.wake_at == host.now + seconds(1));
  CHECK(words(host.pass(milliseconds(999))).empty());
  CHECK(words(host.pass(milliseconds(1))) == Words{"end store round 0", "tell members gathering 1", "open store"});
  CHECK(host.state.restart_count == 1);
  CHECK(words(host.store_opened(5001)) ==
        Words{"serve #2 round 1", "send #2 start 1", "serve #1 round 1", "send #1 start 1", "run round 1"});

  // Node 2's agent dies: the round ends as a membership change, and 2 nodes are too few for --nnodes=3.
  CHECK(words(host.step(RoundEvent::link_lost(1, kGone))) ==
        Words{"drop #1", "gone: group rank 2", "tell members end 1"});
  host.own(RoundEvent::Kind::kOwnAttemptOver);
  CHECK(words(host.wake()).empty());
  host.said(2, NodeMessage::make_stopped(1));
  const RoundActions end = host.wake();
  CHECK(words(end) == Words{"stop store", "tell all exit 1", "end job 1"});
  CHECK(first(end, RoundAction::Kind::kEndJob).end.reason ==
        "the agent of node 2 (10.0.0.3:4000) " + kGone +
            "; only 2 nodes remain, fewer than the 3 that --nnodes=3 needs, so the job cannot go on");
}

TEST_CASE("round_decide: a c10d job below MIN waits, its last call starts round 0, a late joiner is taken in, and "
          "one more waits at MAX",
          "[round_decide]") {
  RendezvousSettings s = c10d_job(2, 3);
  Host host(s);
  const RoundTime t0 = host.now;

  const RoundActions joined = host.join();
  CHECK(words(joined) == Words{"print", "tell members gathering 0"});  // 1 of MIN 2: no last call yet
  CHECK(printed(joined) == std::vector<std::string>{"cpprun: this agent hosts the c10d rendezvous at 10.0.0.1:29400 "
                                                    "(--rdzv_id=job7, --nnodes=2:3)"});
  CHECK(host.wake_at == t0 + s.join_timeout);
  host.now += seconds(10);
  const RoundActions second = host.hello(-1, "10.0.0.2:4000");
  CHECK(words(second) == Words{"admit #1", "print", "tell members gathering 0"});
  CHECK(printed(second) == std::vector<std::string>{"cpprun: 2 nodes (--nnodes=2:3) at 10.0.0.1:29400; starting round "
                                                    "0 in 30 s unless more join (--rdzv_conf last_call_timeout)"});
  CHECK(words(host.wake()).empty());
  CHECK(host.wake_at == t0 + seconds(40));  // the last call
  CHECK(words(host.pass(milliseconds(29999))).empty());
  CHECK(words(host.pass(milliseconds(1))) == Words{"open store"});
  const RoundActions round0 = host.store_opened(5000);
  CHECK(words(round0) == Words{"send #1 start 0", "print", "run round 0"});
  CHECK(printed(round0) ==
        std::vector<std::string>{"cpprun: rendezvous round 0 complete at 10.0.0.1:29400: 2 nodes of --nnodes=2:3, 2 "
                                 "workers (node 0: rank 0, node 1 (10.0.0.2:4000): rank 1), MASTER_PORT=5000"});

  // Scale-up: the job has room, so the running round ends for the newcomer, not counted as a restart.
  const RoundActions late = host.hello(-1, "10.0.0.4:4000");
  CHECK(words(late) == Words{"admit #2", "send #2 queued 0", "print", "tell members end 0"});
  CHECK(printed(late) == std::vector<std::string>{"cpprun: the agent at 10.0.0.4:4000 joined the running job; ending "
                                                  "round 0 to take it in"});
  CHECK(first(late, RoundAction::Kind::kSend).message.restarting);
  host.own(RoundEvent::Kind::kOwnAttemptOver);
  CHECK(words(host.wake()).empty());  // node 1 has not stopped yet
  host.said(1, NodeMessage::make_stopped(0));
  CHECK(words(host.wake()) == Words{"end store round 0", "tell members gathering 1", "open store"});  // MAX: at once
  const RoundActions round1 = host.store_opened(5001);
  CHECK(words(round1) == Words{"send #1 start 1", "send #2 start 1", "print", "run round 1"});
  CHECK(host.state.restart_count == 0);
  CHECK(first(round1, RoundAction::Kind::kRunRound).layout.world_size == 3);

  // At MAX: a fourth waits for a next round, and nothing ends.
  const RoundActions full = host.hello(-1, "10.0.0.5:4000");
  CHECK(words(full) == Words{"admit #3", "send #3 queued 1", "print"});
  CHECK(printed(full) == std::vector<std::string>{"cpprun: the agent at 10.0.0.5:4000 joined; it waits for a next "
                                                  "round (the job runs at its maximum of --nnodes=2:3)"});
  CHECK_FALSE(host.state.ending());
  // It leaves before its round.
  const RoundActions left = host.step(RoundEvent::link_lost(3, kGone));
  CHECK(words(left) == Words{"drop #3", "print"});
  CHECK(printed(left) ==
        std::vector<std::string>{"cpprun: warning: the agent at 10.0.0.5:4000 left before it got into a round"});
}

TEST_CASE("round_decide: a c10d job below MIN at the join timeout tells every node and fails", "[round_decide]") {
  Host host(c10d_job(2, 3));
  host.join();
  CHECK(words(host.pass(host.settings.join_timeout - milliseconds(1))).empty());
  const RoundActions timed_out = host.pass(milliseconds(1));
  CHECK(words(timed_out) == Words{"tell all exit 1", "fail 1"});
  CHECK(first(timed_out, RoundAction::Kind::kFail).end.reason ==
        "cpprun: rendezvous timed out after 600 s (--rdzv_conf join_timeout): 1 of the at least 2 nodes that "
        "--nnodes=2:3 needs joined at 10.0.0.1:29400 (--rdzv_id=job7). Start cpprun on more nodes with the same "
        "--rdzv_endpoint, --rdzv_id and --nnodes, or raise --rdzv_conf join_timeout=SECONDS.");
}

TEST_CASE("round_decide: static, a node that left before the round is named apart at the join timeout",
          "[round_decide]") {
  Host host(static_job(3));
  host.join();
  host.hello(1, "10.0.0.2:4000");
  const RoundActions left = host.step(RoundEvent::link_lost(1, kGone));
  CHECK(words(left) == Words{"drop #1", "print", "tell members gathering 0"});
  CHECK(printed(left) == std::vector<std::string>{"cpprun: warning: the agent of node 1 (10.0.0.2:4000) left before "
                                                  "round 0 started; waiting for a node 1 again"});
  const RoundActions timed_out = host.pass(host.settings.join_timeout);
  CHECK(first(timed_out, RoundAction::Kind::kFail).end.reason.find(
            "node rank 2 of --nnodes=3 never arrived at 10.0.0.1:29500; node rank 1 joined at 10.0.0.1:29500 but "
            "left again before the others came") != std::string::npos);
}

TEST_CASE("round_decide: a duplicate node rank and another --rdzv_id are refused, naming the fix", "[round_decide]") {
  Host host(static_job(3));
  host.join();
  host.hello(1, "10.0.0.2:4000");
  const RoundActions twice = host.hello(1, "10.0.0.9:4000");
  CHECK(words(twice) == Words{"print", "refuse: exit 2"});
  CHECK(printed(twice) == std::vector<std::string>{"cpprun: warning: refused the agent at 10.0.0.9:4000: "
                                                   "--node_rank=1 has already joined from 10.0.0.2:4000; give each "
                                                   "node its own --node_rank"});
  CHECK(first(twice, RoundAction::Kind::kRefuse).message.end.reason ==
        "cpprun: the agent of node 0 refused this agent: --node_rank=1 has already joined from 10.0.0.2:4000; give "
        "each node its own --node_rank");
  NodeHello h;  // node 2 of another job
  h.node_rank = 2;
  h.min_nodes = h.max_nodes = 3;
  h.run_id = "b";
  const NodeMessage m = NodeMessage::make_hello(h);
  const RoundActions other = host.step(RoundEvent::hello("10.0.0.3:4000", m));
  CHECK(words(other) == Words{"print", "refuse: exit 2"});
  CHECK(printed(other) == std::vector<std::string>{"cpprun: warning: refused the agent at 10.0.0.3:4000: --node_rank=2 "
                                                   "has --rdzv_id=b but node 0 has --rdzv_id=none; every node of a "
                                                   "job needs the same --rdzv_id (or another --master_port for "
                                                   "another job)"});
  CHECK(host.state.members.size() == 1);
  CHECK(host.state.next_id == 2);  // a refused agent gets no id
}

TEST_CASE("round_decide: a node that never reports its workers stopped is lost at --shutdown_timeout + 30 s",
          "[round_decide]") {
  RendezvousSettings s = c10d_job(1, 3);
  s.max_restarts = 1;
  Host host(s);
  host.join();
  host.hello(-1, "10.0.0.2:4000");
  host.hello(-1, "10.0.0.3:4000");
  CHECK(words(host.wake()) == Words{"open store"});
  host.store_opened(5000);
  host.own(RoundEvent::Kind::kOwnFailed, {1, true, "rank 0 on node 0 exited with code 1"});
  host.own(RoundEvent::Kind::kOwnAttemptOver);
  host.said(1, NodeMessage::make_stopped(0));
  CHECK(words(host.wake()).empty());
  const RoundTime deadline = host.now + host.settings.shutdown_timeout + kStopSlack;
  CHECK(host.wake_at == deadline);
  CHECK(words(host.pass(std::chrono::duration_cast<milliseconds>(deadline - host.now) - milliseconds(1))).empty());
  // Node 2 is lost (and the loss outranks the failure: not counted), then the round changes at once.
  const RoundActions lost = host.pass(milliseconds(1));
  CHECK(words(lost) ==
        Words{"drop #2", "gone: group rank 2", "end store round 0", "print", "tell members gathering 1"});
  CHECK(host.wake_at == host.now + host.settings.last_call_timeout);  // 2 of MAX 3: the last call opened again
  CHECK(host.state.restart_count == 0);
  CHECK(host.state.members.size() == 1);
}

TEST_CASE("round_decide: quick failures double the restart backoff; a long attempt starts it over", "[round_decide]") {
  RendezvousSettings s = c10d_job(2, 2);
  s.max_restarts = 5;
  s.restart_backoff = {milliseconds(500), milliseconds(20000)};
  Host host(s);
  host.join();
  host.hello(-1, "10.0.0.2:4000");
  host.wake();
  host.store_opened(5000);
  // Fails `ran` after its start; all stop; returns the backoff the host waits.
  const auto fail_after = [&](milliseconds ran) {
    host.now += ran;
    host.own(RoundEvent::Kind::kOwnFailed, {1, true, "rank 0 exited with code 1"});
    host.own(RoundEvent::Kind::kOwnAttemptOver);
    host.said(1, NodeMessage::make_stopped(host.state.round));
    host.wake();
    REQUIRE(host.wake_at);  // the backoff's due time
    const milliseconds wait = std::chrono::duration_cast<milliseconds>(*host.wake_at - host.now);
    const Words next{"end store round " + std::to_string(host.state.round),
                     "tell members gathering " + std::to_string(host.state.round + 1), "open store"};
    CHECK(words(host.pass(wait)) == next);
    host.store_opened(5000);
    return wait.count();
  };
  CHECK(fail_after(milliseconds(10)) == 500);
  CHECK(fail_after(milliseconds(10)) == 1000);
  CHECK(fail_after(milliseconds(10)) == 2000);
  CHECK(fail_after(seconds(20)) == 500);  // ran as long as the cap: healthy
  CHECK(host.state.restart_count == 4);
}

TEST_CASE("round_decide: a done host collects the others' evidence, then carries out what it had decided",
          "[round_decide]") {
  RendezvousSettings s = c10d_job(2, 3);  // no restarts: a failure ends the job
  Host host(s);
  host.join();
  host.hello(-1, "10.0.0.2:4000");
  host.pass(s.last_call_timeout);
  host.store_opened(5000);
  host.own(RoundEvent::Kind::kOwnDone);
  host.own(RoundEvent::Kind::kOwnAttemptOver);
  CHECK(words(host.wake()).empty());  // the exit barrier: node 1 still runs
  const JobEnd failed{3, true, "rank 1 on node 1 exited with code 3"};
  host.said(1, NodeMessage::make_failed(0, failed));
  CHECK(words(host.said(1, NodeMessage::make_evidence(0, RankEvidence{}))) == Words{"evidence #1"});
  CHECK(words(host.wake()) == Words{"collect late evidence"});
  // Meanwhile node 1 is lost: what was decided (the job ends with the failure) stands.
  host.step(RoundEvent::link_lost(1, kGone));
  const RoundActions end = host.wake();
  CHECK(words(end) == Words{"stop store", "tell all exit 1", "end job 1"});
  CHECK(first(end, RoundAction::Kind::kEndJob).end.reason == "the agent of node 1 (10.0.0.2:4000) " + kGone);
}

TEST_CASE("round_decide: every node done finishes the job; news of another round is stale", "[round_decide]") {
  Host host(static_job(2));
  host.join();
  host.hello(1, "10.0.0.2:4000");
  host.wake();
  host.store_opened(5000);
  CHECK(words(host.said(1, NodeMessage::make_done(7))).empty());
  CHECK(host.state.members[0].progress == MemberProgress::kRunning);
  host.said(1, NodeMessage::make_done(0));
  host.own(RoundEvent::Kind::kOwnDone);
  host.own(RoundEvent::Kind::kOwnAttemptOver);
  CHECK(words(host.wake()) == Words{"stop store", "tell all exit 0", "finish"});
  // The keeper ending now is no failure: every node's workers are done.
  CHECK(words(host.own(RoundEvent::Kind::kKeeperEnded, {1, false, "the store keeper exited"})).empty());
}

TEST_CASE("round_decide: the host's worker stuck in D state ends the job, restarts left or not", "[round_decide]") {
  RendezvousSettings s = c10d_job(1, 2);
  s.max_restarts = 3;
  Host host(s);
  host.join();
  host.hello(-1, "10.0.0.2:4000");
  CHECK(words(host.wake()) == Words{"open store"});
  host.store_opened(5000);
  // Not restartable (Note [An unhealthy attempt] in workers/attempt.h), as a member's would be.
  const JobEnd stuck{1, false, "rank 0 (local_rank 0, pid 40) on node 0 stuck in uninterruptible sleep (D state)"};
  CHECK(words(host.own(RoundEvent::Kind::kOwnFailed, stuck)) == Words{"tell members end 0"});
  host.own(RoundEvent::Kind::kOwnAttemptOver);
  const RoundActions end = host.wake();
  CHECK(words(end) == Words{"stop store", "tell all exit 1", "end job 1"});
  CHECK(first(end, RoundAction::Kind::kEndJob).end.reason == stuck.reason);
  CHECK(host.state.restart_count == 0);
}

// A c10d job of 2:3 nodes loses one while running; the next round is gathered from the two left,
// waiting out its last call. A node lost then is lost as between rounds: below MIN the job ends at
// once (it waited out the join timeout, then blamed too few joining); and a member's job-ending
// signal then ends the job on every node (its message was dropped, the others went on).
TEST_CASE("round_decide: while the next round is gathered, a member lost below MIN or signalled ends the job",
          "[round_decide]") {
  for (const bool signalled : {false, true}) {
    INFO((signalled ? "a member signalled" : "a member lost"));
    Host host(c10d_job(2, 3));
    host.join();
    host.hello(-1, "10.0.0.2:4000");
    host.hello(-1, "10.0.0.3:4000");
    CHECK(words(host.wake()) == Words{"open store"});  // MAX: at once
    host.store_opened(5000);
    CHECK(words(host.step(RoundEvent::link_lost(2, kGone))) ==
          Words{"drop #2", "gone: group rank 2", "tell members end 0"});
    host.own(RoundEvent::Kind::kOwnAttemptOver);
    host.said(1, NodeMessage::make_stopped(0));
    const RoundActions gathering = host.wake();
    CHECK(words(gathering) == Words{"end store round 0", "print", "tell members gathering 1"});  // 2 of 3: last call
    REQUIRE(host.state.phase == RoundPhase::kGathering);
    if (signalled) {
      CHECK(words(host.said(1, NodeMessage::make_failed(0, {143, false, "the agent of node 1 received SIGTERM"})))
                .empty());
    } else {
      CHECK(words(host.step(RoundEvent::link_lost(1, kGone))) == Words{"drop #1"});
    }
    const RoundActions ended = host.wake();  // the host steps on a wake after any news
    CHECK(words(ended) == Words{"stop store", std::string("tell all exit ") + (signalled ? "143" : "1"),
                                std::string("end job ") + (signalled ? "143" : "1")});
    if (!signalled) {
      CHECK(first(ended, RoundAction::Kind::kEndJob).end.reason ==
            "the agent at 10.0.0.2:4000 " + kGone +
                " while round 1 was gathered; only 1 node remains, fewer than the 2 that --nnodes=2:3 needs, so the "
                "job cannot go on");
    }
  }
  // Before the job ran, a node that leaves the gathering is not counted: the others wait for more.
  Host first_round(c10d_job(2, 3));
  first_round.join();
  first_round.hello(-1, "10.0.0.2:4000");
  const RoundActions left = first_round.step(RoundEvent::link_lost(1, kGone));
  CHECK(words(left) == Words{"drop #1", "print", "tell members gathering 0"});
}

TEST_CASE("round_decide: a signal ends the job, before it started and after; a keeper ending is fatal",
          "[round_decide]") {
  Host before(static_job(2));
  before.join();
  const RoundActions early = before.step(RoundEvent::signalled(SIGTERM));
  CHECK(words(early) == Words{"stop store", "tell all exit 143", "end job 143"});
  CHECK(first(early, RoundAction::Kind::kEndJob).end.reason ==
        "cpprun: the agent of node 0 received SIGTERM before the job started");

  Host host(c10d_job(1, 2));
  host.join();
  host.hello(-1, "10.0.0.2:4000");
  CHECK(words(host.wake()) == Words{"open store"});
  host.store_opened(5000);
  const RoundActions keeper = host.own(RoundEvent::Kind::kKeeperEnded, {1, false, "the store keeper exited"});
  CHECK(words(keeper) == Words{"tell members end 0"});
  host.own(RoundEvent::Kind::kOwnAttemptOver);
  CHECK(words(host.wake()) == Words{"stop store", "tell all exit 1", "end job 1"});  // fatal: no waiting for stops
  const RoundActions late = host.step(RoundEvent::signalled(SIGINT));
  CHECK(first(late, RoundAction::Kind::kEndJob).end.reason ==
        "the agent hosting the rendezvous at 10.0.0.1:29400 received SIGINT");
}

TEST_CASE("round_decide: a diagnosis request goes to the members whose workers run, and only while the round runs",
          "[round_decide]") {
  Host host(c10d_job(1, 3));
  host.join();
  host.hello(-1, "10.0.0.2:4000");
  host.hello(-1, "10.0.0.3:4000");
  CHECK_FALSE(evidence_askees(host.state).has_value());  // gathering
  host.wake();
  host.store_opened(5000);
  CHECK(evidence_askees(host.state) == std::vector<int>{1, 2});
  host.said(1, NodeMessage::make_done(0));
  CHECK(evidence_askees(host.state) == std::vector<int>{2});  // a done node has nothing to add
  host.said(2, NodeMessage::make_failed(0, {1, true, "rank 2 exited with code 1"}));
  CHECK_FALSE(evidence_askees(host.state).has_value());  // the round ended
  Host alone(static_job(1));
  const Words joined = words(alone.join());
  REQUIRE_FALSE(joined.empty());
  CHECK(joined.back() == "open store");  // every node is here at once
  alone.store_opened(5000);
  CHECK_FALSE(evidence_askees(alone.state).has_value());
}

TEST_CASE("round_decide: a c10d job of one node opted out of the agents' store runs its round untunnelled",
          "[round_decide]") {
  // TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (Note [Opting out of the agent's store]): worker rank 0 hosts the
  // store at the port open_store picked, MASTER_ADDR the host's --local_addr, as torchrun's rank-0 node.
  for (const bool agent_store : {true, false}) {
    RendezvousSettings settings = c10d_job(1, 1, 2);
    settings.job_secret = std::string(64, 'a');
    settings.agent_store = agent_store;
    Host host(settings);
    CHECK(words(host.join()).back() == "open store");
    // The step decides, whatever address came with the event (the executor gives "" when opted out).
    const RoundActions started = host.step(RoundEvent::store_opened("127.0.0.1", 43210));
    const RankLayout& own = first(started, RoundAction::Kind::kRunRound).layout;
    CHECK(own.master_port == 43210);
    CHECK(own.store_tunnelled == agent_store);
    CHECK(own.master_addr == (agent_store ? "127.0.0.1" : "10.0.0.1"));
  }
}
