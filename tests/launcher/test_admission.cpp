// Unit tests of the rendezvous host's admission rules (rendezvous/admission.h), without a socket:
// settings mismatches, static node ranks (out of range, taken, late), and c10d's joining, waiting
// and being taken in by a running job.
#include "catch.h"

#include <string>

#include "rendezvous/admission.h"
#include "rendezvous_jobs.h"

using namespace cpprun::launcher;
using launcher_test::c10d_job;
using launcher_test::hello_like;
using launcher_test::static_job;

namespace {

Admission decide(const RendezvousSettings& settings, const RoundState& state, const NodeHello& hello) {
  return decide_admission(settings, state, NodeMessage::make_hello(hello));
}

RoundState running(int members) {
  RoundState state;
  state.phase = RoundPhase::kRunning;
  for (int i = 1; i <= members; ++i) {
    state.members.push_back({-1, "10.0.0." + std::to_string(i + 1) + ":4000", MemberProgress::kRunning});
  }
  return state;
}

}  // namespace

TEST_CASE("admission: an agent that does not say hello first is refused", "[admission]") {
  const RendezvousSettings s = static_job(2);
  const Admission a = decide_admission(s, RoundState{}, NodeMessage::make_done(0));
  CHECK(a.kind == Admission::Kind::kRefuse);
  CHECK(a.reason == "it did not introduce itself");
}

TEST_CASE("admission: another agent protocol is refused, naming both versions", "[admission]") {
  const RendezvousSettings s = static_job(2);
  NodeHello h = hello_like(s, 1);
  h.protocol = kNodeProtocolVersion - 1;
  const Admission a = decide(s, RoundState{}, h);
  CHECK(a.kind == Admission::Kind::kRefuse);
  CHECK(a.reason == "it speaks agent protocol " + std::to_string(kNodeProtocolVersion - 1) + ", the host speaks " +
                        std::to_string(kNodeProtocolVersion) + "; run the same cpprun version on every node");
}

TEST_CASE("admission: settings that differ from the host's are refused, naming the option", "[admission]") {
  SECTION("--rdzv_backend") {
    const RendezvousSettings s = static_job(2);
    NodeHello h = hello_like(s, 1);
    h.backend = "c10d";
    const Admission a = decide(s, RoundState{}, h);
    CHECK(a.kind == Admission::Kind::kRefuse);
    CHECK(a.reason ==
          "it has --rdzv_backend=c10d but node 0 has --rdzv_backend=static; every node needs the same --rdzv_backend");
  }
  SECTION("--rdzv_id, static: the node is named by its rank, another --master_port is the way out") {
    const RendezvousSettings s = static_job(2);
    NodeHello h = hello_like(s, 1);
    h.run_id = "other";
    const Admission a = decide(s, RoundState{}, h);
    CHECK(a.kind == Admission::Kind::kRefuse);
    CHECK(a.reason == "--node_rank=1 has --rdzv_id=other but node 0 has --rdzv_id=none; every node of a job needs "
                      "the same --rdzv_id (or another --master_port for another job)");
  }
  SECTION("--rdzv_id, c10d: the job is named by its endpoint") {
    const RendezvousSettings s = c10d_job(1, 3);
    NodeHello h = hello_like(s, -1);
    h.run_id = "other";
    const Admission a = decide(s, RoundState{}, h);
    CHECK(a.kind == Admission::Kind::kRefuse);
    CHECK(a.reason == "it has --rdzv_id=other but the job at 10.0.0.1:29400 has --rdzv_id=job7; every node of a "
                      "job needs the same --rdzv_id (or another --rdzv_endpoint for another job)");
  }
  SECTION("--nnodes, in each backend's spelling") {
    const RendezvousSettings st = static_job(2);
    NodeHello h = hello_like(st, 1);
    h.min_nodes = h.max_nodes = 3;
    CHECK(decide(st, RoundState{}, h).reason ==
          "--node_rank=1 has --nnodes=3 but node 0 has --nnodes=2; every node needs the same --nnodes");
    const RendezvousSettings c = c10d_job(1, 3);
    NodeHello hc = hello_like(c, -1);
    hc.min_nodes = 2;  // MIN alone differs
    CHECK(decide(c, RoundState{}, hc).reason ==
          "it has --nnodes=2:3 but the job at 10.0.0.1:29400 has --nnodes=1:3; every node needs the same --nnodes");
  }
  SECTION("--max_restarts") {
    const RendezvousSettings s = static_job(2);
    NodeHello h = hello_like(s, 1);
    h.max_restarts = 2;
    const Admission a = decide(s, RoundState{}, h);
    CHECK(a.kind == Admission::Kind::kRefuse);
    CHECK(a.reason == "--node_rank=1 has --max_restarts=2 but node 0 has --max_restarts=0; nodes restart together, "
                      "so they need the same value");
  }
  SECTION("the first difference is named: the backend before the run id") {
    const RendezvousSettings s = static_job(2);
    NodeHello h = hello_like(s, 1);
    h.backend = "c10d";
    h.run_id = "other";
    CHECK(decide(s, RoundState{}, h).reason.rfind("it has --rdzv_backend=c10d", 0) == 0);
  }
}

TEST_CASE("admission: static, a --node_rank outside 1..nnodes-1 is refused", "[admission]") {
  const RendezvousSettings s = static_job(3);
  const Admission zero = decide(s, RoundState{}, hello_like(s, 0));
  CHECK(zero.kind == Admission::Kind::kRefuse);
  CHECK(zero.reason == "--node_rank=0 is node 0's own rank; give each node its own --node_rank from 1 to 2");
  const Admission three = decide(s, RoundState{}, hello_like(s, 3));
  CHECK(three.kind == Admission::Kind::kRefuse);
  CHECK(three.reason == "--node_rank=3 is not below --nnodes=3; give each node its own --node_rank from 1 to 2");
}

TEST_CASE("admission: static, a duplicate --node_rank is refused, naming who holds it", "[admission]") {
  const RendezvousSettings s = static_job(3);
  RoundState state;
  state.members = {{1, "10.0.0.2:41234"}};
  const Admission a = decide(s, state, hello_like(s, 1));
  CHECK(a.kind == Admission::Kind::kRefuse);
  CHECK(a.reason == "--node_rank=1 has already joined from 10.0.0.2:41234; give each node its own --node_rank");
  CHECK(decide(s, state, hello_like(s, 2)).kind == Admission::Kind::kJoin);  // the other rank is free
}

TEST_CASE("admission: static, a node that comes once the job runs is refused (no next round)", "[admission]") {
  const RendezvousSettings s = static_job(3);
  RoundState state;
  state.phase = RoundPhase::kRunning;
  state.members = {{1, "10.0.0.2:41234"}};  // node 2 left, say: its rank is free, yet the job runs
  const Admission a = decide(s, state, hello_like(s, 2));
  CHECK(a.kind == Admission::Kind::kRefuse);
  CHECK(a.reason == "the job's 3 nodes are all running already");
}

TEST_CASE("admission: a matching node joins the round being gathered while it has room", "[admission]") {
  const RendezvousSettings st = static_job(2);
  CHECK(decide(st, RoundState{}, hello_like(st, 1)).kind == Admission::Kind::kJoin);
  const RendezvousSettings c = c10d_job(2, 3);
  RoundState state;
  state.members = {{-1, "10.0.0.2:4000"}};  // 2 of MAX 3: room for one more
  const Admission a = decide(c, state, hello_like(c, -1));
  CHECK(a.kind == Admission::Kind::kJoin);
  CHECK(a.reason.empty());
}

TEST_CASE("admission: c10d, a round being gathered at MAX queues the newcomer", "[admission]") {
  const RendezvousSettings c = c10d_job(1, 2);
  RoundState state;
  state.members = {{-1, "10.0.0.2:4000"}};  // host + 1 = MAX
  const Admission a = decide(c, state, hello_like(c, -1));
  CHECK(a.kind == Admission::Kind::kQueue);
  CHECK_FALSE(a.taken_in);  // gathering: not a running round to end
  CHECK_FALSE(a.ends_round);
  CHECK(a.reason == "the job runs at its maximum of --nnodes=1:2");
}

TEST_CASE("admission: c10d, a late joiner ends a running round with room (a membership change)", "[admission]") {
  const RendezvousSettings c = c10d_job(1, 3);
  const Admission a = decide(c, running(1), hello_like(c, -1));
  CHECK(a.kind == Admission::Kind::kQueue);
  CHECK(a.taken_in);
  CHECK(a.ends_round);
  CHECK(a.reason.empty());
}

TEST_CASE("admission: c10d, a late joiner while the round is already ending is taken in without ending it again",
          "[admission]") {
  const RendezvousSettings c = c10d_job(1, 3);
  RoundState state = running(1);
  state.end = JobEnd{};
  state.self_done = true;  // a failed round restarts anyway, even with a node done
  const Admission a = decide(c, state, hello_like(c, -1));
  CHECK(a.kind == Admission::Kind::kQueue);
  CHECK(a.taken_in);
  CHECK_FALSE(a.ends_round);
}

TEST_CASE("admission: c10d, a late joiner waits when the job is finishing", "[admission]") {
  const RendezvousSettings c = c10d_job(1, 3);
  RoundState state = running(1);
  state.members[0].progress = MemberProgress::kDone;  // its workers all succeeded: the job is finishing
  const Admission a = decide(c, state, hello_like(c, -1));
  CHECK(a.kind == Admission::Kind::kQueue);
  CHECK_FALSE(a.taken_in);
  CHECK_FALSE(a.ends_round);
  CHECK(a.reason == "the job is finishing");
}

TEST_CASE("admission: c10d, the round full: MAX counts the nodes already waiting", "[admission]") {
  const RendezvousSettings c = c10d_job(1, 3);
  SECTION("running at MAX") {
    const Admission a = decide(c, running(2), hello_like(c, -1));
    CHECK(a.kind == Admission::Kind::kQueue);
    CHECK_FALSE(a.taken_in);
    CHECK(a.reason == "the job runs at its maximum of --nnodes=1:3");
  }
  SECTION("running below MAX, with a node already queued for the free place") {
    RoundState state = running(1);
    state.queued.resize(1);
    const Admission a = decide(c, state, hello_like(c, -1));
    CHECK(a.kind == Admission::Kind::kQueue);
    CHECK_FALSE(a.taken_in);
    CHECK(a.reason == "the job runs at its maximum of --nnodes=1:3");
  }
}

TEST_CASE("admission: a worker count outside --nproc_per_node's range is refused, naming it", "[admission]") {
  // Only a hostile or broken peer says this: it would size the rank layouts and the evidence kept.
  const RendezvousSettings s = static_job(2);
  const RendezvousSettings c = c10d_job(1, 3);
  for (const int workers : {0, -1, kMaxNprocPerNode + 1, 1 << 30}) {
    NodeHello h = hello_like(s, 1);
    h.shape.local_world_size = workers;
    const Admission a = decide(s, RoundState{}, h);
    CHECK(a.kind == Admission::Kind::kRefuse);
    CHECK(a.reason == "--node_rank=1 says it runs " + std::to_string(workers) +
                          " workers, outside --nproc_per_node's 1 to 65536; run the same cpprun version on every node");
    NodeHello hc = hello_like(c, -1);
    hc.shape.local_world_size = workers;
    CHECK(decide(c, RoundState{}, hc).kind == Admission::Kind::kRefuse);
  }
  NodeHello most = hello_like(s, 1);
  most.shape.local_world_size = kMaxNprocPerNode;
  CHECK(decide(s, RoundState{}, most).kind == Admission::Kind::kJoin);
}

TEST_CASE("admission: c10d, no more than MAX nodes wait for a place", "[admission]") {
  const RendezvousSettings c = c10d_job(1, 3);
  RoundState state = running(2);
  state.queued.resize(2);
  CHECK(decide(c, state, hello_like(c, -1)).kind == Admission::Kind::kQueue);  // the third may wait
  state.queued.resize(3);
  const Admission a = decide(c, state, hello_like(c, -1));
  CHECK(a.kind == Admission::Kind::kRefuse);
  CHECK(a.reason == "3 nodes already wait for a place in the job (--nnodes=1:3 takes no more than 3 at once); "
                    "start this one when a node has left");
}
