// Unit tests of torchrun's rank arithmetic across nodes.
#include "catch.h"

#include "workers/rank_layout.h"

using namespace cpprun::launcher;

TEST_CASE("rank_layout: one node hosts ranks 0..N-1 at --master_port", "[rank_layout]") {
  const RankLayout l = single_node_layout(3);
  CHECK(l.base_rank == 0);
  CHECK(l.world_size == 3);
  CHECK(l.group_rank == 0);
  CHECK(l.group_world_size == 1);
  CHECK(l.role_world_size == 3);
  CHECK(l.master_port == 0);
}

TEST_CASE("rank_layout: a node's ranks are contiguous, ordered by node rank", "[rank_layout]") {
  const std::vector<NodeShape> nodes = {{2, "default"}, {1, "default"}, {3, "default"}};
  const int expected_base[] = {0, 2, 3};
  for (int node = 0; node < 3; ++node) {
    INFO("node " << node);
    const RankLayout l = multi_node_layout(nodes, node);
    CHECK(l.group_rank == node);
    CHECK(l.group_world_size == 3);
    CHECK(l.base_rank == expected_base[node]);
    CHECK(l.world_size == 6);
    CHECK(l.role_base_rank == l.base_rank);
    CHECK(l.role_world_size == 6);
  }
}

TEST_CASE("rank_layout: role ranks count only the nodes of the same role", "[rank_layout]") {
  const std::vector<NodeShape> nodes = {{2, "trainer"}, {1, "reader"}, {2, "trainer"}, {4, "reader"}};
  const RankLayout third = multi_node_layout(nodes, 2);
  CHECK(third.base_rank == 3);
  CHECK(third.world_size == 9);
  CHECK(third.role_base_rank == 2);
  CHECK(third.role_world_size == 4);
  const RankLayout last = multi_node_layout(nodes, 3);
  CHECK(last.base_rank == 5);
  CHECK(last.role_base_rank == 1);
  CHECK(last.role_world_size == 5);
}

TEST_CASE("rank_layout: a dry run assumes every node has --nproc_per_node workers", "[rank_layout]") {
  RendezvousSettings c;
  c.shape.local_world_size = 4;
  c.min_nodes = c.max_nodes = 3;  // --nnodes=3
  c.node_rank = 2;
  const RankLayout l = assumed_layout(c);
  CHECK(l.base_rank == 8);
  CHECK(l.world_size == 12);
  CHECK_THROWS_AS(multi_node_layout({{1, "default"}}, 1), std::logic_error);

  // c10d: this node as the first of MIN to join.
  c.backend = RendezvousBackend::kC10d;
  c.node_rank = -1;
  c.min_nodes = 2;
  c.max_nodes = 5;
  const RankLayout e = assumed_layout(c);
  CHECK(e.group_rank == 0);
  CHECK(e.group_world_size == 2);
  CHECK(e.base_rank == 0);
  CHECK(e.world_size == 8);
}
