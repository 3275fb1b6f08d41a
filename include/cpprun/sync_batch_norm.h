// SyncBatchNorm: batch normalisation whose batch statistics are those of the whole group's
// batch, as torch.nn.SyncBatchNorm. A drop-in for torch::nn::BatchNorm{1,2,3}d: the same
// options, parameters and buffers (names included, so state dicts load either way); in eval
// mode, or in a group of one, it is plain BatchNorm.
//
//   struct Net : torch::nn::Module {
//     cpprun::SyncBatchNorm bn{nullptr};
//     Net(cpprun::ProcessGroup g) { bn = register_module("bn", cpprun::SyncBatchNorm(16, g)); }
//   };
//   cpprun::SyncBatchNorm(16);   // no group: the default one, as torch.nn.SyncBatchNorm(16)
//   // or convert a model built with BatchNorm{1,2,3}d (see convert_sync_batchnorm's caveat):
//   auto net = cpprun::convert_sync_batchnorm(make_net(), group);
#pragma once

#include <torch/nn/cloneable.h>
#include <torch/nn/module.h>
#include <torch/nn/options/batchnorm.h>
#include <torch/nn/pimpl.h>

#include <memory>
#include <optional>

#include "cpprun/process_group.h"

namespace cpprun {

// Note [SyncBatchNorm]: in training, every rank's per-channel sum, sum of squares and element
// count are all-reduced over the group, so each rank normalises with the global batch's mean
// and (biased) variance; the backward pass all-reduces the gradients of those sums, which gives
// the gradient of all ranks' losses together. Running statistics are updated as BatchNorm does
// (momentum, or a cumulative average when momentum is unset; unbiased variance). Every rank of
// the group must run the layer the same number of times, in the same order (each run is a
// collective); local batches may differ in size.
class SyncBatchNormImpl : public torch::nn::Cloneable<SyncBatchNormImpl> {
 public:
  SyncBatchNormImpl(const torch::nn::BatchNormOptions& options, ProcessGroup group);
  SyncBatchNormImpl(int64_t num_features, ProcessGroup group)
      : SyncBatchNormImpl(torch::nn::BatchNormOptions(num_features), std::move(group)) {}
  // No group, as PyTorch's process_group=None: each training forward uses the default group when
  // init_process_group() has run, else this process's batch alone (torch.nn.SyncBatchNorm's
  // fallback without torch.distributed).
  explicit SyncBatchNormImpl(const torch::nn::BatchNormOptions& options);
  explicit SyncBatchNormImpl(int64_t num_features) : SyncBatchNormImpl(torch::nn::BatchNormOptions(num_features)) {}

  void reset() override;
  void reset_parameters();
  void reset_running_stats();
  void pretty_print(std::ostream& stream) const override;

  // input: [N, C] or [N, C, ...] (up to 3 spatial dims), C = num_features.
  at::Tensor forward(const at::Tensor& input);

  // The group given at construction; none for the default group (as PyTorch's attribute).
  const std::optional<ProcessGroup>& process_group() const { return group_; }

  torch::nn::BatchNormOptions options;
  at::Tensor weight, bias;                                        // when options.affine()
  at::Tensor running_mean, running_var, num_batches_tracked;      // when options.track_running_stats()

 private:
  friend std::shared_ptr<torch::nn::Module> convert_sync_batchnorm(std::shared_ptr<torch::nn::Module>,
                                                                   const std::optional<ProcessGroup>&);
  struct Adopted {  // a BatchNorm's tensors, registered instead of fresh ones (conversion)
    at::Tensor weight, bias, running_mean, running_var, num_batches_tracked;
  };
  SyncBatchNormImpl(const torch::nn::BatchNormOptions& options, std::optional<ProcessGroup> group, Adopted adopted);
  std::optional<ProcessGroup> group_;  // none: the default group at each forward
  Adopted adopted_;
};
TORCH_MODULE(SyncBatchNorm);

// Replaces every torch::nn::BatchNorm{1,2,3}d in `module` (and `module` itself, when it is one:
// use the result) by a SyncBatchNorm over `group` (none: the default group, as above) holding
// the same parameter and buffer tensors (shared, as torch.nn.SyncBatchNorm.convert_sync_batchnorm
// does). Replaced are the registered submodules and the entries of Sequential and ModuleList
// containers. A module whose forward() calls a BatchNorm through its own member (`bn(x)` where
// `torch::nn::BatchNorm2d bn`) still calls the old module: C++ cannot re-point that member, so
// assign it yourself (`bn = register_module(...)` with a SyncBatchNorm) or declare it as
// cpprun::SyncBatchNorm.
std::shared_ptr<torch::nn::Module> convert_sync_batchnorm(std::shared_ptr<torch::nn::Module> module,
                                                          const std::optional<ProcessGroup>& group = std::nullopt);

}  // namespace cpprun
