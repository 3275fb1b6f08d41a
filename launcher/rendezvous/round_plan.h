// What the host does to start the round it gathered: what each node is told, what the diagnosis
// keeps of the round's ranks, and what the console says, as a pure function of the round
// (round_state.h), so that the numbering and torchrun's rank arithmetic are unit-tested without a
// socket. The host (rendezvous_host.cpp) opens the round's store keeper on a port the kernel picks
// (I/O); its step (round_decide.h) then has it send and print what this gives.
#pragma once

#include <string>
#include <vector>

#include "command_line/rendezvous_settings.h"
#include "diagnosis/node_evidence.h"
#include "rendezvous/node_messages.h"
#include "rendezvous/round_state.h"
#include "workers/rank_layout.h"

namespace cpprun::launcher {

struct RoundPlan {
  RankLayout own;                   // the host's workers: group rank 0
  std::vector<NodeMessage> starts;  // starts[i]: the `start` for state.members[i]
  NodeMessage queued;               // to every queued node: the round runs without it
  std::vector<NodeSlice> slices;    // by group rank, each node's ranks (for the diagnosis)
  std::vector<std::string> lines;   // for the console, each without its newline
};

// The round `state` gathered, its workers' store at `master_port` on the host. The members' group
// ranks: static, their --node_rank (every one from 1 to --nnodes - 1, as admission ensures; else
// std::logic_error); c10d, their order in state.members, which is the order they joined in. Each
// node's ranks follow those of the nodes before it (multi_node_layout), c10d's MASTER_ADDR is the
// host's --local_addr, and the console hears of static's first round (each agent announces a
// restart itself) and of every c10d round.
// `store_loopback` ("127.0.0.1", "::1"): the workers' store is tunnelled (Note [Store tunnel wired]
// in store_tunnel_io.h): the host's workers' MASTER_ADDR is that loopback, and every member is told
// to listen for its own workers on its loopback. "" (--no_job_secret): every node's workers reach
// the store directly at the host's address, as the store listens on every interface.
RoundPlan plan_round(const RendezvousSettings& settings, const RoundState& state, int master_port,
                     const std::string& store_loopback = "");

}  // namespace cpprun::launcher
