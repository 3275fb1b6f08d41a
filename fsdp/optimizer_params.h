// FSDP's parameters as its optimizer sees them (each rank steps its rows of every parameter, by
// the parameter's name), for saving and loading the optimizer's state as whole tensors by name
// (core/optimizer_state_dict.h): a state tensor's rows are gathered over the shard group, and a
// whole one is cut back to this rank's rows.
#pragma once

#include <vector>

#include "core/optimizer_state_dict.h"
#include "fsdp/param_bucket.h"

namespace cpprun::detail {

// `buckets` and `shard_group` must outlive the result.
OptimizerParams fsdp_optimizer_params(const std::vector<ParamBucket>& buckets, const ProcessGroup& shard_group);

}  // namespace cpprun::detail
