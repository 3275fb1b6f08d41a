// cpprun::FusedAdamW: torch::optim::AdamW whose step() runs ATen's fused kernel
// (at::_fused_adamw_, what PyTorch's AdamW(fused=True) runs) once per parameter group, device and
// dtype, where LibTorch's AdamW launches about ten kernels per parameter.
//
//   cpprun::FusedAdamW optimizer(model->parameters(), torch::optim::AdamWOptions(3e-4).weight_decay(0.1));
//
// It is a torch::optim::AdamW: the same constructors, options, parameter groups and per-parameter
// state (AdamWParamState: step, exp_avg, exp_avg_sq, max_exp_avg_sq), so save/load,
// cpprun's optimizer state files and the wrappers (DDP, FSDP's shards, GradScaler, which unscales
// before step()) see no difference. The arithmetic is AdamW's, decoupled weight decay included; it
// rounds as PyTorch's fused AdamW does, not as LibTorch's per-parameter step (in float32 the two
// part in the last bits).
//
// The kernel exists on CUDA and on the CPU, for float64, float32, bfloat16 and float16 parameters.
// Sparse gradients are refused (PyTorch's fused AdamW refuses them too).
#pragma once

#include <torch/optim/adamw.h>

#include <unordered_map>
#include <vector>

namespace cpprun {

class FusedAdamW : public torch::optim::AdamW {
 public:
  using torch::optim::AdamW::AdamW;

  torch::Tensor step(LossClosure closure = nullptr) override;

  // For a step captured in a CUDA graph (at::cuda::CUDAGraph) and replayed `times` more times:
  // the replays advanced the device's step counts, and this advances the counts of record
  // (AdamWParamState::step, which state files hold) of the parameters the captured step stepped.
  // The kernel reads lr, betas, eps and weight decay as the capture saw them: a replay does not
  // see later changes to the options.
  void count_replayed_steps(int64_t times);

 private:
  // The kernel reads each parameter's step count from a float32 tensor on the parameter's device
  // (as PyTorch keeps it). The count of record stays AdamWParamState::step; this is its copy
  // there, advanced by one foreach add per step, and written afresh whenever the two part
  // (the first step, a load, a reset state).
  struct DeviceStep {
    torch::Tensor count;
    int64_t value = -1;  // what `count` holds
  };
  std::unordered_map<void*, DeviceStep> device_steps_;  // keyed as AdamW's state_: the TensorImpl
  std::vector<void*> last_stepped_;  // the parameters the last step() stepped
};

}  // namespace cpprun
