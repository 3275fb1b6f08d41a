// Refuses an optimizer (or anything else) that reads the gradients of the wrapped module's own,
// full parameters after a synchronized backward, when they live in the shards: see Note [Full
// gradients after a synchronized backward].
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <span>
#include <vector>

#include "fsdp/param_bucket.h"

namespace cpprun::detail {

class FullGradientGuard {
 public:
  // One guard per sharded parameter of `buckets`; `rank` names this rank in the error.
  FullGradientGuard(std::span<const ParamBucket> buckets, int rank);
  ~FullGradientGuard();  // disarmed, its guards forgotten
  FullGradientGuard(const FullGradientGuard&) = delete;
  FullGradientGuard& operator=(const FullGradientGuard&) = delete;

  // A synchronized backward has ended: each full parameter's .grad becomes its guard.
  void arm();
  // A forward starts: each .grad that is still its guard becomes none.
  void disarm();

 private:
  std::vector<at::Tensor> params_;
  std::vector<at::Tensor> guards_;
  bool armed_ = false;
};

// Asked first by the extension key's handler (report_uses_then_run): for an operator taking a
// guard, throws the error naming model->parameters(), or (an operator that only drops or zeroes
// it, or autograd adding into it) leaves the operator's result on the stack and returns true.
// false: the operator takes no guard; run it.
bool handle_full_gradient_use(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// Whether `grad` is a full parameter's guard, set as its .grad now.
bool is_full_gradient_guard(const at::Tensor& grad);

}  // namespace cpprun::detail
