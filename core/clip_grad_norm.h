// Gradient clipping by the norm of all gradients together, as torch::nn::utils::clip_grad_norm_
// computes it, for DDP (every rank holds all gradients) and FSDP (each rank a shard of them), with
// or without tensor parallelism (a split gradient is part of a whole one on each TP rank).
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cpprun/process_group.h"
#include "cpprun/tensor_parallel_split.h"

namespace torch::nn {
class Module;
}  // namespace torch::nn

namespace cpprun::detail {

struct GradientToClip {
  at::Tensor grad;  // undefined: skipped
  // The tensor-parallel group the parameter is split across (its ranks' grads are the pieces of
  // one); none when it is whole, and equal, on every rank of any such group.
  std::optional<ProcessGroup> split_over;
  // false: another rank's copy of this gradient is counted (a pipeline's tied weight): scaled
  // with the others, not counted in the norm.
  bool counted = true;
};

// The gradients of every parameter of a module that holds all of them (DDP's, a plain module's),
// each tensor once (LibTorch lists a tied weight under each name; Python's parameters() once), in
// the order of their first names; those `splits` names are parts of one over their group.
std::vector<GradientToClip> module_gradients(const torch::nn::Module& module,
                                             const std::map<std::string, TensorParallelSplit>& splits);

// torch.nn.utils.clip_grad_norm_'s arguments (foreach: always, as its default on CUDA; on the
// CPU the same per-tensor norms).
struct ClipOptions {
  double max_norm = 0;
  double norm_type = 2.0;
  bool error_if_nonfinite = false;
};

// Multiplies the grads by min(1, max_norm / (norm + 1e-6)) (a NaN or infinite norm as PyTorch:
// every gradient times NaN, or 0), the norm of order norm_type of all of them together; returns
// that norm before clipping, the same on every rank. See Note [Clipping as
// torch.nn.utils.clip_grad_norm_]. `sum_over`: the group whose ranks' grads together make up
// every gradient once (FSDP's shards), whose parts are then combined across ranks; null when
// this rank's grads are all of them. `then_over`: a second such group, combined after the first
// (a pipeline's FSDP stages: the stages over the pipeline group, then the shards over their
// own). The parts of split gradients are first combined over their tensor-parallel group. `who`
// names the caller in errors.
double clip_grad_norm(const std::vector<GradientToClip>& grads, const ClipOptions& options, const ProcessGroup* sum_over,
                      const char* who, const ProcessGroup* then_over = nullptr);

// Parameters whose gradients are each rank's part of one (FSDP's shards, by name), while their
// owner lives: the free cpprun::clip_grad_norm_ refuses them, as its norm would be this rank's
// part's alone (Note [Clipping a wrapper's gradients]).
void register_partial_gradients(const std::vector<std::pair<std::string, at::Tensor>>& params);
void unregister_partial_gradients(const std::vector<std::pair<std::string, at::Tensor>>& params);

}  // namespace cpprun::detail
