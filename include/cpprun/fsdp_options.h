// Options of cpprun::FullyShardedDataParallel.
#pragma once

#include <c10/core/ScalarType.h>
#include <torch/arg.h>
#include <torch/nn/module.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>


namespace cpprun {

struct FsdpOptions {
  // ZeRO stage: 1 shards optimizer state, 2 also gradients, 3 also parameters. 3 by default, as
  // PyTorch's FullyShardedDataParallel (FULL_SHARD) and fully_shard shard parameters by default
  // (it was 2 until 2026-12-04: a ported fully_shard(m) kept every full parameter on every rank).
  TORCH_ARG(int, stage) = 3;
  // Units (wrapped modules whose parameters are gathered and released together, with one
  // all-gather and one reduce-scatter per dtype): every submodule holding at least this many
  // parameters not already in a smaller unit becomes one; 0: the whole model is one unit.
  TORCH_ARG(int64_t, auto_wrap_min_params) = 0;
  // Units by module type: submodules for which this returns true become units (e.g. every
  // transformer block). Applied before auto_wrap_min_params.
  TORCH_ARG(std::function<bool(const torch::nn::Module&)>, wrap_policy) = nullptr;
  // Mixed precision: the module computes in param_dtype (e.g. at::kBFloat16) from parameters
  // gathered in that dtype, floating-point tensor inputs are cast to it, gradients are reduced in
  // reduce_dtype (default: the parameters' own dtype, as FSDP2's since PyTorch 2.15; no_sync
  // backwards accumulate in it too), and the optimizer steps fp32 master shards.
  TORCH_ARG(std::optional<at::ScalarType>, param_dtype) = std::nullopt;
  TORCH_ARG(std::optional<at::ScalarType>, reduce_dtype) = std::nullopt;
  // FSDP2's MixedPrecisionPolicy.output_dtype: the wrapper's floating-point forward outputs cast
  // to it (e.g. at::kFloat: bf16 logits handed to the loss in fp32, torchtitan's use). FSDP2 casts
  // each fully_shard module's outputs; cpprun's units have no forward of their own to intercept,
  // so the cast is of what model->forward returns (a tensor, or the tensors of a tuple, pair or
  // vector of them).
  TORCH_ARG(std::optional<at::ScalarType>, output_dtype) = std::nullopt;
  // FSDP2's MixedPrecisionPolicy.cast_forward_inputs: false passes model->forward's floating-point
  // tensor arguments as they come, rather than cast to param_dtype (a model that casts its own).
  TORCH_ARG(bool, cast_forward_inputs) = true;

  // Stage 3. Each unit's parameters are all-gathered when first used and released again:
  // after forward unless reshard_after_forward is false (the root unit, holding the top-level
  // module's own parameters, and the unit forward used last always stay for backward; false
  // keeps them after a forward without autograd too), and once backward has produced the unit's
  // gradients (unless set_reshard_after_backward(false)). Changeable in training:
  // model->set_reshard_after_forward() (fsdp.h).
  TORCH_ARG(bool, reshard_after_forward) = true;
 public:  // (TORCH_ARG leaves the section private)
  // PyTorch's fully_shard(reshard_after_forward=8) reshards to a smaller world of 8 ranks; cpprun
  // has no such form, and an int would silently convert to true: not callable with one.
  FsdpOptions& reshard_after_forward(int) = delete;
  // Gathers the next unit (in the order the last forward used them; reversed in backward) while
  // the current one computes.
  TORCH_ARG(bool, prefetch) = true;
  // At most this many units gathered at once (default: the root, the one computing, the one
  // being prefetched); the least recently used is released to make room. Stages 2 and 3: above
  // 1, one unit's gradient reduction runs while the next unit's backward computes, so two units'
  // full gradients exist at once; 1 gives the least memory and no overlap at all.
  TORCH_ARG(int, gathered_unit_limit) = 3;
  // Stage 3: keep the shards, their gradients and so the optimizer state in CPU memory (pinned
  // when the model is on a GPU) and step the optimizer there; each gather copies a shard to the
  // model's device first, each reduced gradient shard is copied back. A no-op for a CPU model.
  TORCH_ARG(bool, cpu_offload) = false;

  // HSDP (FullyShardedDataParallel(net, mesh, options) with a 2-D DeviceMesh): the mesh
  // dimension (by name) to shard over; the other one replicates. Empty: the last dimension (so a
  // {replicate, shard} or {node, local} mesh shards within a row / node).
  TORCH_ARG(std::string, shard_dim) = "";
};

// Manual wrapping, for wrap_policy: exactly these submodules become units. One may sit inside
// another; the outer unit then holds the parameters the inner one does not.
//   FsdpOptions().stage(3).wrap_policy(cpprun::wrap_modules({net->encoder.ptr(), net->decoder.ptr()}))
inline std::function<bool(const torch::nn::Module&)> wrap_modules(std::vector<std::shared_ptr<torch::nn::Module>> modules) {
  return [modules = std::move(modules)](const torch::nn::Module& m) {
    for (const auto& chosen : modules) {
      if (chosen.get() == &m) return true;
    }
    return false;
  };
}

}  // namespace cpprun
