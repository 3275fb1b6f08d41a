// What the rendezvous between the nodes needs of the command line (launch_config.h fills it in). In
// command_line/ because the parser builds it; workers/rank_layout.h and rendezvous/ read it.
#pragma once

#include <chrono>
#include <optional>
#include <string>

#include "command_line/restart_backoff_settings.h"

namespace cpprun::launcher {

// --rdzv_backend. static: a fixed set of nodes, each told its --node_rank, meeting at node 0.
// c10d: torchrun's dynamic rendezvous of MIN to MAX nodes at --rdzv_endpoint (node_rendezvous.h).
enum class RendezvousBackend { kStatic, kC10d };

// The most workers one node may run (--nproc_per_node's range is 1 to this). The rendezvous host
// refuses an agent that says it runs more or fewer: the number sizes every node's rank layout and
// bounds what a node's diagnosis evidence may hold.
inline constexpr int kMaxNprocPerNode = 1 << 16;

// What each node tells the rendezvous about itself.
struct NodeShape {
  int local_world_size = 1;  // its --nproc_per_node
  std::string role = "default";
};

struct RendezvousSettings {
  RendezvousBackend backend = RendezvousBackend::kStatic;
  int min_nodes = 1;  // --nnodes=MIN:MAX; static: both are --nnodes
  int max_nodes = 1;
  int node_rank = -1;  // static: --node_rank; c10d: -1 (the host numbers the nodes as they join)
  // static: node 0's store (--master_addr, --master_port); c10d: --rdzv_endpoint.
  std::string host = "127.0.0.1";
  int port = 0;
  // How errors name `host`: "--master_addr=HOST", "the host of --rdzv_endpoint=HOST:PORT" ("": the former).
  std::string host_flag;
  std::chrono::milliseconds join_timeout{600 * 1000};
  std::chrono::milliseconds last_call_timeout{30 * 1000};  // c10d; static never waits for more
  std::optional<bool> is_host;                             // c10d: --rdzv_conf is_host
  int max_restarts = 0;
  RestartBackoffSettings restart_backoff;
  std::chrono::milliseconds shutdown_timeout{5000};
  std::string run_id = "none";
  NodeShape shape;         // --nproc_per_node and --role
  std::string job_secret;  // "" with --no_job_secret
  std::string job_secret_note;  // where this user's shared secret is kept, when the user gave none
  // c10d: --local_addr, the workers' MASTER_ADDR when this agent hosts ("": the endpoint's host).
  std::string local_addr;
  // false: worker rank 0 hosts the workers' store, at a free port, and the agents run no store keeper
  // (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 on a c10d job of one node: Note [Opting out of the agent's
  // store] in launch_config.cpp).
  bool agent_store = true;

  // static: every node brings its rank, and the host is node 0.
  bool fixed_ranks() const { return backend == RendezvousBackend::kStatic; }
  // The agents talk to each other: static with several nodes, or c10d (even 1:1, like torchrun).
  bool multi_node() const { return !fixed_ranks() || max_nodes > 1; }
  std::string endpoint() const;     // "127.0.0.1:29400"
  std::string nnodes_flag() const;  // "--nnodes=2" (static), "--nnodes=1:3" (c10d)
  // The --rdzv_conf key of join_timeout: "timeout" (static, as torchrun's) or "join_timeout" (c10d).
  const char* join_timeout_key() const { return fixed_ranks() ? "timeout" : "join_timeout"; }
};

const char* backend_name(RendezvousBackend backend);  // "static", "c10d"

// "127.0.0.1:29400"; "[::1]:29400" for an IPv6 address.
std::string endpoint_text(const std::string& host, int port);

}  // namespace cpprun::launcher
