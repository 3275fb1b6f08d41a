// The rendezvous settings a host's command line gives, for the rendezvous rules' unit tests
// (admission, round plans): a static job of `nnodes` nodes at 10.0.0.1:29500 (--rdzv_id none),
// or a c10d job of MIN:MAX nodes at 10.0.0.1:29400 (--rdzv_id job7, --local_addr 10.0.0.1), each
// node running `nproc` workers.
#pragma once

#include "command_line/rendezvous_settings.h"

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

}  // namespace launcher_test
