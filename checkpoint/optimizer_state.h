// An optimizer's state for one parameter as named tensors of the parameter's shape, so that a
// sharded checkpoint can cut it at other shard boundaries. Knows SGD, Adam and AdamW.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

#include <map>
#include <optional>
#include <string>

namespace cpprun::detail {

struct ParamOptimizerState {
  int64_t step = 0;
  std::map<std::string, at::Tensor> tensors;  // e.g. "exp_avg", "exp_avg_sq", "momentum_buffer"
};

// nullopt: the optimizer holds no state for `param` yet (it has not stepped).
std::optional<ParamOptimizerState> read_optimizer_state(torch::optim::Optimizer& optimizer, const at::Tensor& param);
void write_optimizer_state(torch::optim::Optimizer& optimizer, const at::Tensor& param,
                           const ParamOptimizerState& state);
// Forgets `param`'s state, as if the optimizer had never stepped it.
void clear_optimizer_state(torch::optim::Optimizer& optimizer, const at::Tensor& param);

}  // namespace cpprun::detail
