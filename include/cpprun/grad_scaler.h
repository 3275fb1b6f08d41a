// cpprun::GradScaler: loss scaling for fp16 training, for one process, DDP and every ZeRO stage
// (torch.amp.GradScaler and FSDP's ShardedGradScaler in one).
//
//   cpprun::GradScaler scaler;                  // over the default process group, if there is one
//   scaler.scale(loss).backward();
//   scaler.unscale_(optimizer);                 // optional: before clipping
//   model->clip_grad_norm(1.0);
//   scaler.step(optimizer);                     // skipped if any rank found an inf or NaN
//   scaler.update();                            // halve the scale after an overflow, double it
//                                               // after growth_interval clean steps
//
// Under ZeRO-2/3 each rank holds only its shard of the gradients, so an overflow may show on one
// rank alone: the scaler takes the maximum of the ranks' inf/NaN flags over its group before
// deciding, and every rank skips or steps together. Under DDP the gradients are already equal;
// the agreement costs one 4-byte all-reduce a step.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/arg.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <map>
#include <optional>

#include "cpprun/process_group.h"

namespace cpprun {

// PyTorch's names and defaults.
struct GradScalerOptions {
  TORCH_ARG(double, init_scale) = 65536.0;
  TORCH_ARG(double, growth_factor) = 2.0;
  TORCH_ARG(double, backoff_factor) = 0.5;
  TORCH_ARG(int64_t, growth_interval) = 2000;
  // Disabled: scale() returns the loss as is, step() just steps, update() does nothing.
  TORCH_ARG(bool, enabled) = true;
};

class GradScaler {
 public:
  // The inf/NaN decision is agreed over the default group of the moment, looked up at each
  // unscale_() or step() (a scaler built before init_process_group(), as a member or a global,
  // follows it too, as PyTorch's ShardedGradScaler does), else it is this process's own.
  explicit GradScaler(GradScalerOptions options = {});
  // Agreed over `group` (e.g. the group FSDP shards over). Every rank of it must call step().
  GradScaler(ProcessGroup group, GradScalerOptions options = {});

  // loss * scale.
  at::Tensor scale(const at::Tensor& loss);
  // Divides the gradients of `optimizer`'s parameters by the scale in place and records whether
  // any rank's were inf or NaN. At most once per optimizer between update()s. Collective.
  void unscale_(torch::optim::Optimizer& optimizer);
  // unscale_ (unless done), then optimizer.step() unless an overflow was found. Returns whether
  // it stepped. Collective (through unscale_).
  bool step(torch::optim::Optimizer& optimizer);
  // Backs off (scale * backoff_factor) if any optimizer stepped over an overflow since the last
  // update, else counts a clean step and grows the scale after growth_interval of them. Call once
  // per iteration, after every step().
  void update();
  // Sets the scale instead (as PyTorch's update(new_scale)); the growth count is kept.
  void update(double new_scale);

  double get_scale() const;
  int64_t growth_tracker() const;
  bool is_enabled() const { return options_.enabled(); }

  // The scale, the growth count, growth_factor, backoff_factor and growth_interval, under
  // "grad_scaler/..." keys: what PyTorch's state_dict() holds; load() restores them all (an
  // archive from before 2026-12-04, without the last three, keeps this scaler's).
  void save(torch::serialize::OutputArchive& archive) const;
  void load(torch::serialize::InputArchive& archive);

 private:
  enum class Stage { kReady, kUnscaled, kStepped };
  struct PerOptimizer {
    Stage stage = Stage::kReady;
    at::Tensor found_inf;  // agreed over the group
    bool any_gradient = false;  // on any rank of the group: step() refuses none, as PyTorch's
  };

  void init_scale_like(const at::Tensor& like);
  at::Tensor agreed_found_inf(const at::Tensor& local) const;

  GradScalerOptions options_;
  std::optional<ProcessGroup> group_;  // none: the default group of each step, if there is one
  at::Tensor scale_;           // float32, 1 element, on the device of the first scaled loss
  at::Tensor growth_tracker_;  // int32, same device
  std::map<const torch::optim::Optimizer*, PerOptimizer> per_optimizer_;
};

}  // namespace cpprun
