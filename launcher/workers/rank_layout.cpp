// torchrun's rank assignment (SimpleElasticAgent._assign_worker_ranks).
#include "workers/rank_layout.h"

#include <stdexcept>

namespace cpprun::launcher {

RankLayout single_node_layout(int nproc_per_node) {
  RankLayout layout;
  layout.world_size = nproc_per_node;
  layout.role_world_size = nproc_per_node;
  return layout;
}

RankLayout multi_node_layout(const std::vector<NodeShape>& nodes, int node_rank) {
  if (node_rank < 0 || node_rank >= static_cast<int>(nodes.size())) {
    throw std::logic_error("multi_node_layout: node rank " + std::to_string(node_rank) + " of " +
                           std::to_string(nodes.size()) + " nodes");
  }
  RankLayout layout;
  layout.group_rank = node_rank;
  layout.group_world_size = static_cast<int>(nodes.size());
  layout.world_size = 0;
  layout.role_world_size = 0;
  for (int i = 0; i < layout.group_world_size; ++i) {
    const int workers = nodes[i].local_world_size;
    const bool same_role = nodes[i].role == nodes[node_rank].role;
    layout.world_size += workers;
    layout.role_world_size += same_role ? workers : 0;
    layout.base_rank += i < node_rank ? workers : 0;
    layout.role_base_rank += same_role && i < node_rank ? workers : 0;
  }
  return layout;
}

RankLayout assumed_layout(const RendezvousSettings& settings) {
  const NodeShape& self = settings.shape;
  if (!settings.fixed_ranks()) {
    // c10d: the first of MIN nodes to join.
    return multi_node_layout(std::vector<NodeShape>(settings.min_nodes, self), 0);
  }
  if (!settings.multi_node()) return single_node_layout(self.local_world_size);
  return multi_node_layout(std::vector<NodeShape>(settings.max_nodes, self), settings.node_rank);
}

}  // namespace cpprun::launcher
