// A tensor-parallel split (cpprun/tensor_parallel_split.h) and its whole tensor, both ways: what
// checkpoints (checkpoint/state_view.h) and tensor_parallel_full_state_dict gather and cut by.
#pragma once

#include <ATen/core/Tensor.h>

#include "cpprun/tensor_parallel_split.h"

namespace cpprun::detail {

// The whole tensor of which `shard` is this rank's part. Collective over split.group.
at::Tensor gather_tensor_parallel_split(const at::Tensor& shard, const TensorParallelSplit& split);
// This rank's part of `whole` (a copy): chunk r of each of split.parts blocks along split.dim.
at::Tensor tensor_parallel_shard(const at::Tensor& whole, const TensorParallelSplit& split);

}  // namespace cpprun::detail
