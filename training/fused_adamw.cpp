// See cpprun/fused_adamw.h. One at::_fused_adamw_ call per (group, device, dtype): the kernel
// takes lists of tensors that share all three.
#include "cpprun/fused_adamw.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <map>
#include <tuple>
#include <vector>

namespace cpprun {
namespace {

// The lists one kernel call takes.
struct Bucket {
  std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps;
  std::vector<at::Tensor> steps_to_advance;  // of `steps`, those one step behind: one foreach add
};

using BucketKey = std::tuple<int, int, int>;  // device type, device index, dtype

BucketKey bucket_key(const at::Tensor& t) {
  return {static_cast<int>(t.device().type()), static_cast<int>(t.device().index()), static_cast<int>(t.scalar_type())};
}

}  // namespace

torch::Tensor FusedAdamW::step(LossClosure closure) {
  torch::NoGradGuard no_grad;
  torch::Tensor loss;
  if (closure) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  last_stepped_.clear();
  for (auto& group : param_groups_) {
    const auto& options = static_cast<const torch::optim::AdamWOptions&>(group.options());
    const auto [beta1, beta2] = options.betas();
    std::map<BucketKey, Bucket> buckets;
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      const auto& grad = p.grad();
      TORCH_CHECK(!grad.is_sparse(), "cpprun::FusedAdamW: parameter of shape ", p.sizes(),
                  " has a sparse gradient, which the fused kernel does not take (nor does PyTorch's AdamW(fused=True)); "
                  "use torch::optim::AdamW for it, or a dense gradient (e.g. Embedding without sparse=true)");
      TORCH_CHECK(at::isFloatingType(p.scalar_type()), "cpprun::FusedAdamW: a parameter of dtype ", p.scalar_type(),
                  " (shape ", p.sizes(), "); the fused kernel steps floating-point parameters only");
      TORCH_CHECK(grad.scalar_type() == p.scalar_type() && grad.device() == p.device(),
                  "cpprun::FusedAdamW: a parameter of shape ", p.sizes(), " is ", p.scalar_type(), " on ", p.device(),
                  " but its gradient is ", grad.scalar_type(), " on ", grad.device(),
                  "; the fused kernel needs both alike (cast the gradient, or step the parameter another way)");
      void* key = p.unsafeGetTensorImpl();
      auto& slot = state_[key];
      if (!slot) {
        auto fresh = std::make_unique<torch::optim::AdamWParamState>();
        fresh->exp_avg(torch::zeros_like(p, at::MemoryFormat::Preserve));
        fresh->exp_avg_sq(torch::zeros_like(p, at::MemoryFormat::Preserve));
        if (options.amsgrad()) fresh->max_exp_avg_sq(torch::zeros_like(p, at::MemoryFormat::Preserve));
        slot = std::move(fresh);
      }
      auto& state = static_cast<torch::optim::AdamWParamState&>(*slot);
      if (options.amsgrad() && !state.max_exp_avg_sq().defined()) {  // amsgrad turned on after steps without it
        state.max_exp_avg_sq(torch::zeros_like(p, at::MemoryFormat::Preserve));
      }
      const int64_t previous = state.step();
      state.step(previous + 1);

      auto& bucket = buckets[bucket_key(p)];
      DeviceStep& device_step = device_steps_[key];
      if (device_step.count.defined() && device_step.count.device() == p.device() && device_step.value == previous) {
        bucket.steps_to_advance.push_back(device_step.count);
      } else {
        // A kernel launch, no copy from the host: the value travels as the fill's argument.
        device_step.count = at::full({}, static_cast<double>(state.step()), p.options().dtype(at::kFloat));
      }
      device_step.value = state.step();
      last_stepped_.push_back(key);

      bucket.params.push_back(p);
      bucket.grads.push_back(grad);
      bucket.exp_avgs.push_back(state.exp_avg());
      bucket.exp_avg_sqs.push_back(state.exp_avg_sq());
      if (options.amsgrad()) bucket.max_exp_avg_sqs.push_back(state.max_exp_avg_sq());
      bucket.steps.push_back(device_step.count);
    }
    for (auto& [key, bucket] : buckets) {
      if (!bucket.steps_to_advance.empty()) at::_foreach_add_(bucket.steps_to_advance, 1);
      at::_fused_adamw_(bucket.params, bucket.grads, bucket.exp_avgs, bucket.exp_avg_sqs, bucket.max_exp_avg_sqs,
                        bucket.steps, options.lr(), beta1, beta2, options.weight_decay(), options.eps(),
                        options.amsgrad(), /*maximize=*/false);
    }
  }
  return loss;
}

void FusedAdamW::count_replayed_steps(int64_t times) {
  TORCH_CHECK(times >= 0, "cpprun::FusedAdamW::count_replayed_steps: times must be 0 or more, got ", times);
  for (void* key : last_stepped_) {
    auto found = state_.find(key);
    TORCH_CHECK(found != state_.end(), "cpprun::FusedAdamW::count_replayed_steps: a parameter the captured step "
                "stepped has no state any more (was the state reset or loaded since the capture?)");
    auto& state = static_cast<torch::optim::AdamWParamState&>(*found->second);
    state.step(state.step() + times);
    device_steps_[key].value += times;
  }
}

}  // namespace cpprun
