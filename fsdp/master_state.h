// FSDP's state dict under mixed precision: the fp32 master values, not the compute copies. The
// module computes with parameters in param_dtype (bf16), rounded from the fp32 shards the
// optimizer steps; a state dict made of the compute copies would lose the fp32 bits, and one
// loaded into them would not reach the shards. So, as PyTorch's FSDP2 does (its state_dict()
// holds the sharded fp32 parameters), saves gather the fp32 shards into whole tensors under the
// parameters' names, and loads cut the values back into each rank's shard; the compute copies
// are remade from the shards before the next forward.
#pragma once

#include <torch/nn/module.h>

#include <vector>

#include "cpprun/process_group.h"
#include "fsdp/param_bucket.h"
#include "support/torch_save_file.h"

namespace cpprun::detail {

// The module's state (core/state_dict.h's module_state: parameters then buffers, a tied
// parameter under each name) with every sharded parameter replaced by its fp32 master gathered
// whole, on the parameter's device; buffers and frozen parameters are the module's own tensors.
// The same on every rank of the shard group. Collective over `shard_group`.
NamedTensors gather_master_state(torch::nn::Module& module, const std::vector<ParamBucket>& buckets,
                                 const ProcessGroup& shard_group);

// Copies this rank's rows of each whole master in `state` (as gather_master_state made it, then
// loaded) into the parameter's shard. The compute copies are stale after it: the caller has them
// gathered again (ZeRO-3 does so by itself: the shards' versions changed). Local: `shard_group`
// only tells which rows are this rank's.
void scatter_master_state(const NamedTensors& state, const std::vector<ParamBucket>& buckets,
                          const ProcessGroup& shard_group);

}  // namespace cpprun::detail
