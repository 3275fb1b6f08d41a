// Options of cpprun::FullyShardedDataParallel.
#pragma once

#include <c10/core/ScalarType.h>
#include <torch/arg.h>
#include <torch/nn/module.h>

#include <functional>
#include <optional>

namespace cpprun {

struct FsdpOptions {
  // ZeRO stage: 1 shards optimizer state, 2 also gradients, 3 also parameters.
  TORCH_ARG(int, stage) = 2;
  // Units (one flat parameter each, communicated together): every submodule holding at least
  // this many parameters not already in a smaller unit becomes one; 0: the whole model is one unit.
  TORCH_ARG(int64_t, auto_wrap_min_params) = 0;
  // Units by module type: submodules for which this returns true become units (e.g. every
  // transformer block). Applied before auto_wrap_min_params.
  TORCH_ARG(std::function<bool(const torch::nn::Module&)>, wrap_policy) = nullptr;
  // Mixed precision: the module computes in param_dtype (e.g. at::kBFloat16) from parameters
  // gathered in that dtype, floating-point tensor inputs are cast to it, gradients are reduced in
  // reduce_dtype (default: param_dtype), and the optimizer steps fp32 master shards.
  TORCH_ARG(std::optional<at::ScalarType>, param_dtype) = std::nullopt;
  TORCH_ARG(std::optional<at::ScalarType>, reduce_dtype) = std::nullopt;
};

}  // namespace cpprun
