// Unit tests of what the rendezvous host tells each node when a round starts (rendezvous/round_plan.h),
// without a socket: group ranks in --node_rank order (static) or join order (c10d), each node's ranks
// after the nodes before it with uneven --nproc_per_node and roles, a node that left and came back,
// and what changes from one round to the next.
#include "catch.h"

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "rendezvous/round_plan.h"
#include "rendezvous_jobs.h"

using namespace cpprun::launcher;
using launcher_test::c10d_job;
using launcher_test::static_job;

namespace {

RoundMember member(int node_rank, const std::string& peer, int nproc, const std::string& role = "default") {
  return {node_rank, peer, MemberProgress::kJoined, {nproc, role}};
}

RoundState gathered(int round, int restart_count, std::vector<RoundMember> members) {
  RoundState state;
  state.round = round;
  state.restart_count = restart_count;
  state.members = std::move(members);
  return state;
}

// What a node's `start` says, in one comparable line: group rank/size, base rank, world size.
std::string ranks_of(const RankLayout& l) {
  return std::to_string(l.group_rank) + "/" + std::to_string(l.group_world_size) + " base " +
         std::to_string(l.base_rank) + " of " + std::to_string(l.world_size);
}

}  // namespace

TEST_CASE("round_plan: static numbers the nodes by --node_rank, each node's ranks after those before it",
          "[round_plan]") {
  const RendezvousSettings s = static_job(3, 2);
  const RoundPlan plan =
      plan_round(s, gathered(0, 0, {member(1, "10.0.0.2:4000", 2), member(2, "10.0.0.3:4000", 2)}), 41000);
  CHECK(ranks_of(plan.own) == "0/3 base 0 of 6");
  REQUIRE(plan.starts.size() == 2);
  CHECK(ranks_of(plan.starts[0].layout) == "1/3 base 2 of 6");
  CHECK(ranks_of(plan.starts[1].layout) == "2/3 base 4 of 6");
  for (const NodeMessage& start : plan.starts) {
    CHECK(start.kind == MessageKind::kStart);
    CHECK(start.round == 0);
    CHECK(start.restart_count == 0);
    CHECK(start.layout.master_port == 41000);  // the store keeper's, on the host
    CHECK(start.layout.master_addr.empty());   // static: --master_addr
  }
  CHECK(plan.own.master_port == 41000);
  REQUIRE(plan.lines.size() == 1);
  CHECK(plan.lines[0] ==
        "cpprun: all 3 nodes joined at 10.0.0.1:29500; 6 workers (node 0: ranks 0-1, node 1: ranks 2-3, node 2: ranks "
        "4-5)");
}

TEST_CASE("round_plan: uneven --nproc_per_node and roles: ranks, role ranks, and what the console says",
          "[round_plan]") {
  RendezvousSettings s = c10d_job(1, 3, 2);
  s.shape.role = "trainer";
  const RoundPlan plan = plan_round(
      s, gathered(0, 0, {member(-1, "10.0.0.2:4000", 1, "trainer"), member(-1, "10.0.0.3:4000", 3, "reader")}),
      41000);
  CHECK(ranks_of(plan.own) == "0/3 base 0 of 6");
  REQUIRE(plan.starts.size() == 2);
  const RankLayout& one = plan.starts[0].layout;
  const RankLayout& two = plan.starts[1].layout;
  CHECK(ranks_of(one) == "1/3 base 2 of 6");
  CHECK(ranks_of(two) == "2/3 base 3 of 6");
  // Role ranks count the nodes of the same --role only.
  CHECK(plan.own.role_world_size == 3);
  CHECK(one.role_base_rank == 2);
  CHECK(one.role_world_size == 3);
  CHECK(two.role_base_rank == 0);
  CHECK(two.role_world_size == 3);
  // c10d: the store is on the host, which advertises its --local_addr.
  CHECK(one.master_addr == "10.0.0.1");
  CHECK(plan.own.master_addr == "10.0.0.1");
  // The diagnosis's view of the round: each node's first rank and its number of ranks, node 0 first.
  REQUIRE(plan.slices.size() == 3);
  CHECK((plan.slices[0].node == 0 && plan.slices[0].base_rank == 0 && plan.slices[0].local_world_size == 2));
  CHECK((plan.slices[1].node == 1 && plan.slices[1].base_rank == 2 && plan.slices[1].local_world_size == 1));
  CHECK((plan.slices[2].node == 2 && plan.slices[2].base_rank == 3 && plan.slices[2].local_world_size == 3));
  REQUIRE(plan.lines.size() == 1);
  CHECK(plan.lines[0] ==
        "cpprun: rendezvous round 0 complete at 10.0.0.1:29400: 3 nodes of --nnodes=1:3, 6 workers (node 0: ranks "
        "0-1, node 1 (10.0.0.2:4000): rank 2, node 2 (10.0.0.3:4000): ranks 3-5), MASTER_PORT=41000");
}

TEST_CASE("round_plan: c10d numbers the nodes in join order, so a node that left and came back is last",
          "[round_plan]") {
  const RendezvousSettings s = c10d_job(2, 3, 1);
  const RoundMember a = member(-1, "10.0.0.2:4000", 2);
  const RoundMember b = member(-1, "10.0.0.3:4000", 1);
  const RoundPlan first = plan_round(s, gathered(0, 0, {a, b}), 41000);
  CHECK(ranks_of(first.starts[0].layout) == "1/3 base 1 of 4");  // a
  CHECK(ranks_of(first.starts[1].layout) == "2/3 base 3 of 4");  // b
  // a's agent died and a new one came from the same host: it joined after b.
  const RoundPlan second = plan_round(s, gathered(1, 0, {b, member(-1, "10.0.0.2:4100", 2)}), 42000);
  CHECK(ranks_of(second.starts[0].layout) == "1/3 base 1 of 4");  // b moved up
  CHECK(ranks_of(second.starts[1].layout) == "2/3 base 2 of 4");
  REQUIRE(second.lines.size() == 1);
  CHECK(second.lines[0] ==
        "cpprun: rendezvous round 1 complete at 10.0.0.1:29400: 3 nodes of --nnodes=2:3, 4 workers (node 0: rank 0, "
        "node 1 (10.0.0.3:4000): rank 1, node 2 (10.0.0.2:4100): ranks 2-3), MASTER_PORT=42000");
  // Without it the round is smaller: every node's group size and the world shrink with it.
  const RoundPlan smaller = plan_round(s, gathered(2, 0, {b}), 43000);
  CHECK(ranks_of(smaller.own) == "0/2 base 0 of 2");
  CHECK(ranks_of(smaller.starts[0].layout) == "1/2 base 1 of 2");
}

TEST_CASE("round_plan: static: a node that rejoins gets its node rank, and its ranks, back", "[round_plan]") {
  const RendezvousSettings s = static_job(3, 1);
  const RoundPlan before =
      plan_round(s, gathered(0, 0, {member(1, "10.0.0.2:4000", 1), member(2, "10.0.0.3:4000", 1)}), 41000);
  // Node 1's agent came back from another port, after node 2: its --node_rank decides, not its arrival.
  const RoundPlan after =
      plan_round(s, gathered(1, 1, {member(2, "10.0.0.3:4000", 1), member(1, "10.0.0.2:4100", 1)}), 42000);
  CHECK(ranks_of(after.starts[1].layout) == ranks_of(before.starts[0].layout));  // node 1
  CHECK(ranks_of(after.starts[0].layout) == ranks_of(before.starts[1].layout));  // node 2
  CHECK(ranks_of(after.starts[1].layout) == "1/3 base 1 of 3");
  REQUIRE(after.slices.size() == 3);
  CHECK((after.slices[1].node == 1 && after.slices[1].base_rank == 1));  // by group rank
  CHECK((after.slices[2].node == 2 && after.slices[2].base_rank == 2));
}

TEST_CASE("round_plan: static: node ranks that are not each of 1 to --nnodes - 1 are our bug", "[round_plan]") {
  const RendezvousSettings s = static_job(3, 1);
  CHECK_THROWS_AS(plan_round(s, gathered(0, 0, {member(1, "a:1", 1), member(1, "b:1", 1)}), 41000),
                  std::logic_error);
  CHECK_THROWS_AS(plan_round(s, gathered(0, 0, {member(1, "a:1", 1), member(3, "b:1", 1)}), 41000),
                  std::logic_error);
}

TEST_CASE("round_plan: between rounds the round, the restart count and MASTER_PORT change; static speaks once",
          "[round_plan]") {
  const RendezvousSettings fixed = static_job(2, 2);
  const RoundState restarted = gathered(3, 2, {member(1, "10.0.0.2:4000", 2)});
  const RoundPlan plan = plan_round(fixed, restarted, 45000);
  REQUIRE(plan.starts.size() == 1);
  CHECK(plan.starts[0].round == 3);
  CHECK(plan.starts[0].restart_count == 2);  // TORCHELASTIC_RESTART_COUNT
  CHECK(plan.starts[0].layout.master_port == 45000);
  CHECK(plan.lines.empty());  // static announces its first round only; each agent announces a restart

  // c10d announces every round, in the singular for one node and one worker.
  const RoundPlan alone = plan_round(c10d_job(1, 2, 1), gathered(4, 1, {}), 46000);
  CHECK(alone.starts.empty());
  CHECK(ranks_of(alone.own) == "0/1 base 0 of 1");
  REQUIRE(alone.lines.size() == 1);
  CHECK(alone.lines[0] ==
        "cpprun: rendezvous round 4 complete at 10.0.0.1:29400: 1 node of --nnodes=1:2, 1 worker (node 0: rank 0), "
        "MASTER_PORT=46000");
}

TEST_CASE("round_plan: the queued nodes hear that the round runs without them, and its size", "[round_plan]") {
  RoundState state = gathered(2, 0, {member(-1, "10.0.0.2:4000", 1)});
  state.queued.resize(3);  // arrived at MAX: they wait for a next round
  const RoundPlan plan = plan_round(c10d_job(1, 2, 1), state, 41000);
  CHECK(plan.queued.kind == MessageKind::kQueued);
  CHECK(plan.queued.round == 2);
  CHECK(plan.queued.nodes == 2);          // the nodes running it, the host too
  CHECK_FALSE(plan.queued.restarting);    // nothing ends for them
}

TEST_CASE("round_plan: with a job secret the store is tunnelled: the host's workers use its loopback, members "
          "their own", "[round_plan]") {
  for (const RendezvousSettings& s : {static_job(3, 2), c10d_job(1, 3, 2)}) {
    const bool fixed = s.fixed_ranks();
    const RoundPlan plan = plan_round(
        s, gathered(0, 0, {member(fixed ? 1 : -1, "10.0.0.2:4000", 2), member(fixed ? 2 : -1, "10.0.0.3:4000", 2)}),
        41000, "127.0.0.1");
    CHECK(plan.own.store_tunnelled);
    CHECK(plan.own.master_addr == "127.0.0.1");  // the store keeper's loopback
    CHECK(plan.own.master_port == 41000);
    for (const NodeMessage& start : plan.starts) {
      CHECK(start.layout.store_tunnelled);
      CHECK(start.layout.master_addr.empty());       // each member's listener sets it, not the host's address
      CHECK(start.layout.master_port == 41000);      // the port a member tries first for its listener
    }
  }
  // "" (--no_job_secret): the store reached directly, as before.
  const RoundPlan direct = plan_round(c10d_job(1, 3, 2), gathered(0, 0, {member(-1, "10.0.0.2:4000", 2)}), 41000);
  CHECK_FALSE(direct.own.store_tunnelled);
  CHECK_FALSE(direct.starts[0].layout.store_tunnelled);
  CHECK(direct.starts[0].layout.master_addr == "10.0.0.1");
}
