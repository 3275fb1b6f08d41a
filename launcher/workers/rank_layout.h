// Where one node's workers sit among the job's: torchrun's rank arithmetic. Pure, unit-tested.
#pragma once

#include <string>
#include <vector>

#include "command_line/rendezvous_settings.h"

namespace cpprun::launcher {

struct RankLayout {
  int group_rank = 0;        // GROUP_RANK: this node's rank
  int group_world_size = 1;  // GROUP_WORLD_SIZE: the number of nodes
  int base_rank = 0;         // RANK of this node's local rank 0
  int world_size = 1;        // WORLD_SIZE: workers on all nodes
  int role_base_rank = 0;    // ROLE_RANK of local rank 0
  int role_world_size = 1;   // ROLE_WORLD_SIZE: workers of this node's --role on all nodes
  // MASTER_PORT when the agents chose it (the store keeper's port: the host agent's, multi-node, Note
  // [Workers' store]; a single-node job's when the kernel picked it); 0 means --master_port.
  int master_port = 0;
  // MASTER_ADDR when the agents chose it (c10d: the hosting agent's --local_addr, as torchrun's
  // rank-0 node advertises its own; the loopback where the store keeper listens there alone); ""
  // means --master_addr, or the --rdzv_endpoint host.
  std::string master_addr;
  // The workers' store is reached through the agents' link (Note [Store tunnel wired] in
  // store_tunnel_io.h): a member listens for its workers on its loopback and tells them so.
  bool store_tunnelled = false;
};

// A job of one node: ranks 0..nproc_per_node-1.
RankLayout single_node_layout(int nproc_per_node);

// Node `node_rank`'s layout when node i runs nodes[i].local_world_size workers, as torchrun's
// agent assigns it: a node's ranks are contiguous and ordered by node rank; role ranks likewise,
// counting only the nodes of the same role.
RankLayout multi_node_layout(const std::vector<NodeShape>& nodes, int node_rank);

// Before the rendezvous (--dry_run) a node knows only itself: the layout if every node ran
// --nproc_per_node workers of the same role (c10d: this node joined first, of MIN nodes).
RankLayout assumed_layout(const RendezvousSettings& settings);

}  // namespace cpprun::launcher
