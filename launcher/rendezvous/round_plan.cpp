// See round_plan.h.
#include "rendezvous/round_plan.h"

#include <stdexcept>

#include "rendezvous/node_rendezvous.h"

namespace cpprun::launcher {
namespace {

// By group rank, the index in state.members of the node there; -1 for the host, group rank 0.
std::vector<int> members_by_group_rank(const RendezvousSettings& settings, const RoundState& state) {
  std::vector<int> at(state.count(), -1);
  for (std::size_t i = 0; i < state.members.size(); ++i) {
    const int rank = settings.fixed_ranks() ? state.members[i].node_rank : static_cast<int>(i) + 1;
    // Admission lets a static round start only with every --node_rank from 1 to --nnodes - 1, once.
    if (rank < 1 || rank >= state.count() || at[rank] != -1) {
      throw std::logic_error("plan_round: node rank " + std::to_string(rank) + " in a round of " +
                             std::to_string(state.count()) + " nodes");
    }
    at[rank] = static_cast<int>(i);
  }
  return at;
}

}  // namespace

RoundPlan plan_round(const RendezvousSettings& settings, const RoundState& state, int master_port,
                     const std::string& store_loopback) {
  const std::vector<int> at = members_by_group_rank(settings, state);
  const int count = state.count();
  std::vector<NodeShape> shapes;
  for (int rank = 0; rank < count; ++rank) shapes.push_back(rank == 0 ? settings.shape : state.members[at[rank]].shape);

  RoundPlan plan;
  plan.starts.resize(state.members.size());
  std::string ranks;  // "node 0: ranks 0-1, node 1 (10.0.0.2:4000): rank 2"
  for (int rank = 0; rank < count; ++rank) {
    RankLayout layout = multi_node_layout(shapes, rank);
    layout.master_port = master_port;
    // c10d: the store is on this host; torchrun's rank-0 node advertises its --local_addr.
    if (!settings.fixed_ranks()) layout.master_addr = settings.local_addr;
    if (!store_loopback.empty()) {  // each member sets its own listener's address and port
      layout.store_tunnelled = true;
      layout.master_addr = rank == 0 ? store_loopback : "";
    }
    const int workers = shapes[rank].local_world_size;
    plan.slices.push_back({rank, layout.base_rank, workers});
    ranks += (rank == 0 ? "node " : ", node ") + std::to_string(rank) +
             (rank == 0 || settings.fixed_ranks() ? "" : " (" + state.members[at[rank]].peer + ")") + ": " +
             rank_range(layout.base_rank, workers);
    if (rank == 0) {
      plan.own = layout;
    } else {
      plan.starts[at[rank]] = NodeMessage::make_start(state.round, state.restart_count, layout);
    }
  }
  plan.queued = NodeMessage::make_queued(state.round, count, false);

  const int world = plan.own.world_size;
  if (settings.fixed_ranks() && state.round == 0) {
    plan.lines.push_back("cpprun: all " + std::to_string(count) + " nodes joined at " + settings.endpoint() + "; " +
                         std::to_string(world) + " workers (" + ranks + ")");
  } else if (!settings.fixed_ranks()) {
    plan.lines.push_back("cpprun: rendezvous round " + std::to_string(state.round) + " complete at " +
                         settings.endpoint() + ": " + std::to_string(count) + (count == 1 ? " node" : " nodes") +
                         " of " + settings.nnodes_flag() + ", " + std::to_string(world) +
                         (world == 1 ? " worker (" : " workers (") + ranks +
                         "), MASTER_PORT=" + std::to_string(master_port));
  }
  return plan;
}

}  // namespace cpprun::launcher
