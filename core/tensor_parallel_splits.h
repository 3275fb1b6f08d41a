// What DDP and FSDP need from tensor parallelism (cpprun/tensor_parallel_split.h): a check that
// their data-parallel group leaves each tensor-parallel group's shards apart, and the distinct
// tensor-parallel groups of a model's splits.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "cpprun/process_group.h"
#include "cpprun/tensor_parallel_split.h"

namespace cpprun::detail {

// Refuses a data-parallel group holding another rank of one of `splits`' tensor-parallel groups:
// the two hold different shards under one name, so averaging (or sharding) across them would mix
// them silently. With a {dp, tp} mesh, the data-parallel group is mesh.group("dp"). `who` names
// the wrapper in the error.
void refuse_tensor_parallel_overlap(const std::map<std::string, TensorParallelSplit>& splits,
                                    const ProcessGroup& data_parallel, const char* who);

// The distinct groups among `groups` (several parameters share one tensor-parallel group, each
// holding its own ProcessGroup handle): told apart by their ranks, in the order of their ranks,
// which every rank sees alike, so collectives over them pair up. `index_of[i]`, when asked for,
// is groups[i]'s position among them.
std::vector<ProcessGroup> distinct_groups(const std::vector<const ProcessGroup*>& groups,
                                          std::vector<int64_t>* index_of = nullptr);
// The distinct tensor-parallel groups of `splits` (distinct_groups of their groups).
std::vector<ProcessGroup> tensor_parallel_groups(const std::map<std::string, TensorParallelSplit>& splits);

}  // namespace cpprun::detail
