// Which live tensors are tensor-parallel shards, and over which group: what the free
// cpprun::clip_grad_norm_ given a parameter list needs to take the whole model's norm, as
// PyTorch's does over DTensor parameters. See Note [Split parameters in a parameter list].
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <optional>

#include "cpprun/process_group.h"
#include "cpprun/tensor_parallel_split.h"

namespace cpprun::detail {

// Notes `owner`'s split parameters (owner.tensor_parallel_splits(), found among `module`'s own
// parameters by name; `module` is the owner as a torch::nn::Module) until the owner is destroyed
// (~TensorParallelModule forgets them). cpprun's tensor-parallel layers call it when built;
// parallelize_module calls register_split_parameters_in for the whole model, which covers layers
// of one's own inside it. Calling it again for the same owner is harmless.
void register_split_parameters(const TensorParallelModule& owner, const torch::nn::Module& module);
// The same for every TensorParallelModule in `module`'s tree, `module` included.
void register_split_parameters_in(torch::nn::Module& module);

// The group `param` is split over, when it is a registered shard; none when it is whole (or
// unknown: a layer of one's own never registered).
std::optional<ProcessGroup> split_group_of(const at::Tensor& param);

}  // namespace cpprun::detail
