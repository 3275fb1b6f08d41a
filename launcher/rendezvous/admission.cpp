// See admission.h: the refusals' texts, then joining or waiting (Note [Elastic rounds]).
#include "rendezvous/admission.h"

#include <algorithm>

namespace cpprun::launcher {
namespace {

// Why the agent that sent `h` cannot be part of this job; "" when it can.
std::string refusal(const RendezvousSettings& settings, const RoundState& state, const NodeHello& h) {
  if (h.protocol != kNodeProtocolVersion) {
    return "it speaks agent protocol " + std::to_string(h.protocol) + ", the host speaks " +
           std::to_string(kNodeProtocolVersion) + "; run the same cpprun version on every node";
  }
  const bool fixed = settings.fixed_ranks();
  const std::string where = fixed ? "node 0" : "the job at " + settings.endpoint();
  const std::string backend = backend_name(settings.backend);
  if (h.backend != backend) {
    return "it has --rdzv_backend=" + h.backend + " but " + where + " has --rdzv_backend=" + backend +
           "; every node needs the same --rdzv_backend";
  }
  const std::string who = fixed ? "--node_rank=" + std::to_string(h.node_rank) : "it";
  if (h.run_id != settings.run_id) {
    return who + " has --rdzv_id=" + h.run_id + " but " + where + " has --rdzv_id=" + settings.run_id +
           "; every node of a job needs the same --rdzv_id (or another " +
           (fixed ? "--master_port" : "--rdzv_endpoint") + " for another job)";
  }
  if (h.min_nodes != settings.min_nodes || h.max_nodes != settings.max_nodes) {
    RendezvousSettings theirs = settings;
    theirs.min_nodes = h.min_nodes;
    theirs.max_nodes = h.max_nodes;
    return who + " has " + theirs.nnodes_flag() + " but " + where + " has " + settings.nnodes_flag() +
           "; every node needs the same --nnodes";
  }
  if (h.max_restarts != settings.max_restarts) {
    return who + " has --max_restarts=" + std::to_string(h.max_restarts) + " but " + where +
           " has --max_restarts=" + std::to_string(settings.max_restarts) +
           "; nodes restart together, so they need the same value";
  }
  // Our agents say 1..kMaxNprocPerNode, --nproc_per_node's range; a number outside it would size the
  // rank layouts and the evidence the host keeps for the node.
  if (h.shape.local_world_size < 1 || h.shape.local_world_size > kMaxNprocPerNode) {
    return who + " says it runs " + std::to_string(h.shape.local_world_size) +
           " workers, outside --nproc_per_node's 1 to " + std::to_string(kMaxNprocPerNode) +
           "; run the same cpprun version on every node";
  }
  if (!fixed) return "";
  const int nnodes = settings.max_nodes;
  if (h.node_rank < 1 || h.node_rank >= nnodes) {
    return who + (h.node_rank == 0 ? " is node 0's own rank" : " is not below --nnodes=" + std::to_string(nnodes)) +
           "; give each node its own --node_rank from 1 to " + std::to_string(nnodes - 1);
  }
  const auto taken = std::find_if(state.members.begin(), state.members.end(),
                                  [&](const RoundMember& m) { return m.node_rank == h.node_rank; });
  if (taken != state.members.end()) {
    return who + " has already joined from " + taken->peer + "; give each node its own --node_rank";
  }
  // static has no next round to wait for: a latecomer's --node_rank is a running node's.
  if (state.phase == RoundPhase::kRunning) {
    return "the job's " + std::to_string(nnodes) + " nodes are all running already";
  }
  return "";
}

}  // namespace

Admission decide_admission(const RendezvousSettings& settings, const RoundState& state,
                           const NodeMessage& introduction) {
  if (introduction.kind != MessageKind::kHello) {
    return {Admission::Kind::kRefuse, "it did not introduce itself", false, false};
  }
  if (std::string why = refusal(settings, state, introduction.hello); !why.empty()) {
    return {Admission::Kind::kRefuse, std::move(why), false, false};
  }
  if (state.phase == RoundPhase::kGathering && state.count() < settings.max_nodes) {
    return {Admission::Kind::kJoin, "", false, false};
  }
  // A round runs (or is full): the node waits for the next. Torchrun's agents restart for it when
  // the job has room and is not finishing; so do we. See Note [Elastic rounds]. No more than MAX
  // wait: no round can take more, and each waiting node holds a link (and its descriptors) here.
  if (static_cast<int>(state.queued.size()) >= settings.max_nodes) {
    return {Admission::Kind::kRefuse,
            std::to_string(state.queued.size()) +
                (state.queued.size() == 1 ? " node already waits" : " nodes already wait") +
                " for a place in the job (" +
                settings.nnodes_flag() + " takes no more than " + std::to_string(settings.max_nodes) +
                " at once); start this one when a node has left",
            false, false};
  }
  const bool room = state.count() + static_cast<int>(state.queued.size()) < settings.max_nodes;
  const bool taken_in = state.phase == RoundPhase::kRunning && room && (state.ending() || !state.anyone_done());
  std::string waits;
  if (!taken_in) waits = room ? "the job is finishing" : "the job runs at its maximum of " + settings.nnodes_flag();
  return {Admission::Kind::kQueue, waits, taken_in, taken_in && !state.ending()};
}

}  // namespace cpprun::launcher
