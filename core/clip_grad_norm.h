// Gradient clipping by the norm of all gradients together, as torch::nn::utils::clip_grad_norm_
// computes it, for DDP (every rank holds all gradients) and FSDP (each rank a shard of them).
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "cpprun/process_group.h"

namespace cpprun::detail {

// Scales `grads` (undefined ones are skipped) by max_norm / (norm + 1e-6) when that is below 1;
// returns the norm before clipping. `sum_over`: the group whose ranks' grads together make up
// every gradient once (FSDP's shards), whose squares are then summed across ranks; null when this
// rank's grads are all of them. `who` names the caller in errors.
double clip_grad_norm(const std::vector<at::Tensor>& grads, double max_norm, const ProcessGroup* sum_over,
                      const char* who);

}  // namespace cpprun::detail
