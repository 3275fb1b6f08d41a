// The rendezvous settings a host's command line gives, for the rendezvous rules' unit tests
// (admission, round plans): a static job of `nnodes` nodes at 10.0.0.1:29500 (--rdzv_id none),
// or a c10d job of MIN:MAX nodes at 10.0.0.1:29400 (--rdzv_id job7, --local_addr 10.0.0.1), each
// node running `nproc` workers; and the hello of an agent with the host's own options.
#pragma once

#include "command_line/rendezvous_settings.h"
#include "rendezvous/node_messages.h"

namespace launcher_test {

inline cpprun::launcher::RendezvousSettings static_job(int nnodes, int nproc = 1) {
  cpprun::launcher::RendezvousSettings s;
  s.backend = cpprun::launcher::RendezvousBackend::kStatic;
  s.min_nodes = s.max_nodes = nnodes;
  s.node_rank = 0;
  s.host = "10.0.0.1";
  s.port = 29500;
  s.run_id = "none";
  s.shape.local_world_size = nproc;
  return s;
}

inline cpprun::launcher::RendezvousSettings c10d_job(int min_nodes, int max_nodes, int nproc = 1) {
  cpprun::launcher::RendezvousSettings s;
  s.backend = cpprun::launcher::RendezvousBackend::kC10d;
  s.min_nodes = min_nodes;
  s.max_nodes = max_nodes;
  s.node_rank = -1;
  s.host = "10.0.0.1";
  s.port = 29400;
  s.run_id = "job7";
  s.local_addr = "10.0.0.1";
  s.shape.local_world_size = nproc;
  return s;
}

// The hello of an agent started with the same options as the host's `settings`; `node_rank` -1
// for c10d.
inline cpprun::launcher::NodeHello hello_like(const cpprun::launcher::RendezvousSettings& settings, int node_rank) {
  cpprun::launcher::NodeHello h;
  h.backend = cpprun::launcher::backend_name(settings.backend);
  h.node_rank = node_rank;
  h.min_nodes = settings.min_nodes;
  h.max_nodes = settings.max_nodes;
  h.max_restarts = settings.max_restarts;
  h.run_id = settings.run_id;
  return h;
}

}  // namespace launcher_test
