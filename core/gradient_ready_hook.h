// An autograd post-hook on a parameter's gradient accumulator: runs a function once the
// parameter's .grad holds this backward pass's gradient. DDP and FSDP start their reductions
// from it.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <functional>
#include <memory>
#include <utility>
#include <vector>

namespace cpprun::detail {

class GradientReadyHook : public torch::autograd::FunctionPostHook {
 public:
  explicit GradientReadyHook(std::function<void()> fn) : fn_(std::move(fn)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    fn_();
    return outputs;
  }

 private:
  std::function<void()> fn_;
};

// Hooks on many parameters' accumulators, removed when this goes away. It keeps each
// accumulator alive: a parameter holds its own only weakly.
class GradientReadyHooks {
 public:
  GradientReadyHooks() = default;
  GradientReadyHooks(const GradientReadyHooks&) = delete;
  GradientReadyHooks& operator=(const GradientReadyHooks&) = delete;
  ~GradientReadyHooks() {
    for (std::size_t i = 0; i < accumulators_.size(); ++i) accumulators_[i]->del_post_hook(keys_[i]);
  }

  void add(const at::Tensor& param, std::function<void()> fn) {
    auto accumulator = torch::autograd::impl::grad_accumulator(param);
    keys_.push_back(accumulator->add_post_hook(std::make_unique<GradientReadyHook>(std::move(fn))));
    accumulators_.push_back(std::move(accumulator));
  }
  // The accumulator node of the i-th parameter added (to find it in an autograd graph).
  torch::autograd::Node* accumulator(std::size_t i) const { return accumulators_[i].get(); }

 private:
  // The pointer type grad_accumulator() returns (a shared_ptr before LibTorch 2.15, an
  // intrusive_ptr since).
  using NodePtr = decltype(torch::autograd::impl::grad_accumulator(std::declval<const at::Tensor&>()));
  std::vector<NodePtr> accumulators_;
  std::vector<uintptr_t> keys_;
};

}  // namespace cpprun::detail
