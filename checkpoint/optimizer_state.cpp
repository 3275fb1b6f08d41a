// See optimizer_state.h. LibTorch keys optimizer state by the parameter's TensorImpl pointer.
#include "checkpoint/optimizer_state.h"

#include <c10/util/Exception.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

namespace cpprun::detail {
namespace {

template <typename Map>
typename Map::key_type state_key(const Map&, const at::Tensor& param) {
  return static_cast<typename Map::key_type>(param.unsafeGetTensorImpl());
}

void unsupported(const torch::optim::Optimizer& optimizer) {
  TORCH_CHECK(false, "cpprun sharded checkpoints: cannot reshard the state of this optimizer (",
              typeid(optimizer).name(), "); supported: torch::optim::SGD, Adam, AdamW.");
}

void put(ParamOptimizerState& out, const char* name, const at::Tensor& t) {
  if (t.defined()) out.tensors[name] = t;
}

at::Tensor get(const ParamOptimizerState& in, const char* name) {
  auto it = in.tensors.find(name);
  return it == in.tensors.end() ? at::Tensor() : it->second;
}

}  // namespace

std::optional<ParamOptimizerState> read_optimizer_state(torch::optim::Optimizer& optimizer, const at::Tensor& param) {
  auto& states = optimizer.state();
  auto it = states.find(state_key(states, param));
  if (it == states.end()) {
    if (!dynamic_cast<torch::optim::SGD*>(&optimizer) && !dynamic_cast<torch::optim::Adam*>(&optimizer) &&
        !dynamic_cast<torch::optim::AdamW*>(&optimizer)) {
      unsupported(optimizer);
    }
    return std::nullopt;
  }
  ParamOptimizerState out;
  if (auto* s = dynamic_cast<torch::optim::SGDParamState*>(it->second.get())) {
    put(out, "momentum_buffer", s->momentum_buffer());
  } else if (auto* s = dynamic_cast<torch::optim::AdamParamState*>(it->second.get())) {
    out.step = s->step();
    put(out, "exp_avg", s->exp_avg()), put(out, "exp_avg_sq", s->exp_avg_sq()), put(out, "max_exp_avg_sq", s->max_exp_avg_sq());
  } else if (auto* s = dynamic_cast<torch::optim::AdamWParamState*>(it->second.get())) {
    out.step = s->step();
    put(out, "exp_avg", s->exp_avg()), put(out, "exp_avg_sq", s->exp_avg_sq()), put(out, "max_exp_avg_sq", s->max_exp_avg_sq());
  } else {
    unsupported(optimizer);
  }
  return out;
}

void write_optimizer_state(torch::optim::Optimizer& optimizer, const at::Tensor& param, const ParamOptimizerState& in) {
  auto& states = optimizer.state();
  const auto key = state_key(states, param);
  if (dynamic_cast<torch::optim::SGD*>(&optimizer)) {
    auto s = std::make_unique<torch::optim::SGDParamState>();
    s->momentum_buffer(get(in, "momentum_buffer"));
    states[key] = std::move(s);
  } else if (dynamic_cast<torch::optim::Adam*>(&optimizer)) {
    auto s = std::make_unique<torch::optim::AdamParamState>();
    s->step(in.step), s->exp_avg(get(in, "exp_avg")), s->exp_avg_sq(get(in, "exp_avg_sq"));
    s->max_exp_avg_sq(get(in, "max_exp_avg_sq"));
    states[key] = std::move(s);
  } else if (dynamic_cast<torch::optim::AdamW*>(&optimizer)) {
    auto s = std::make_unique<torch::optim::AdamWParamState>();
    s->step(in.step), s->exp_avg(get(in, "exp_avg")), s->exp_avg_sq(get(in, "exp_avg_sq"));
    s->max_exp_avg_sq(get(in, "max_exp_avg_sq"));
    states[key] = std::move(s);
  } else {
    unsupported(optimizer);
  }
}

void clear_optimizer_state(torch::optim::Optimizer& optimizer, const at::Tensor& param) {
  auto& states = optimizer.state();
  states.erase(state_key(states, param));
}

}  // namespace cpprun::detail
