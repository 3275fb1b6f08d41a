// Options of cpprun::FullyShardedDataParallel.
#pragma once

#include <torch/arg.h>
#include <torch/nn/module.h>

#include <functional>

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
};

}  // namespace cpprun
