// Making a group's backends (Gloo for CPU tensors, NCCL for CUDA ones) over a store: for the
// world group (process_group.cpp) and subgroups (subgroups.cpp). Internal to comm/.
#pragma once

#include <chrono>
#include <string>

#include "comm/c10d_types.h"
#include "cpprun/env.h"

namespace cpprun::detail {

// `env` is the job's environment (it says which interface Gloo listens on and which GPU NCCL
// uses); `rank` and `size` are this process's place in the group being made.
c10::intrusive_ptr<C10dGroup> make_gloo(const c10::intrusive_ptr<c10d::Store>& store, const DistEnv& env,
                                        int rank, int size, std::chrono::milliseconds timeout);
c10::intrusive_ptr<C10dGroup> make_nccl(const c10::intrusive_ptr<c10d::Store>& store, const DistEnv& env,
                                        int rank, int size, std::chrono::milliseconds timeout);

// Returns once each of the group's `size` members has called it with the group's store: after
// its backends are made, so that none is used (or its process ends) while a peer still connects.
// See Note [Members wait for each other after connecting]. `what` names the call in the error.
void wait_for_every_member(c10d::Store& store, int size, std::chrono::milliseconds timeout, const std::string& what);

}  // namespace cpprun::detail
