// The meeting of a new group's ranks in the store: who is missing, and whether every rank has a GPU.
#pragma once

#include <chrono>

#include "comm/c10d_types.h"
#include "cpprun/process_group.h"

namespace cpprun::detail {

struct JoinResult {
  // True when every rank of the job said it has a GPU of its own (its node has a GPU for each of
  // its local ranks). The same answer on every rank: see Note [One device choice per job].
  bool every_rank_has_gpu = false;
};

// Every rank announces itself, then waits for the others, so a missing rank is reported by
// number instead of as a backend's opaque time-out. `has_gpu` is this rank's vote.
JoinResult join_ranks(c10d::Store& store, const DistEnv& env, std::chrono::milliseconds timeout, bool has_gpu);

}  // namespace cpprun::detail
