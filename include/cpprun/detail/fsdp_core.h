// The non-template part of FullyShardedDataParallel. Users do not need this header's names.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cpprun/detail/data_parallel_core.h"
#include "cpprun/device_mesh.h"
#include "cpprun/fsdp_options.h"
#include "cpprun/fsdp_stats.h"
#include "cpprun/process_group.h"

namespace cpprun::detail {

class FsdpCore final : public DataParallelCore {
 public:
  // `mesh`: FSDP over a 1-D mesh, HSDP over a 2-D one (then `group` is mesh->whole()).
  FsdpCore(torch::nn::Module& module, ProcessGroup group, std::optional<DeviceMesh> mesh, FsdpOptions options);
  ~FsdpCore();
  FsdpCore(const FsdpCore&) = delete;
  FsdpCore& operator=(const FsdpCore&) = delete;

  void before_forward() override;
  void after_forward(const std::vector<at::Tensor>& outputs) override;
  // Mixed precision: a floating-point input cast to param_dtype; anything else as it is.
  at::Tensor cast_input(const at::Tensor& input) const override;
  at::Tensor cast_output(const at::Tensor& output) const override;
  // Brings the full parameters up to date with the shards now (normally done by the next forward).
  void gather_full_parameters() override;
  // Registers this rank's shards on `wrapper` under the wrapped module's parameter names, in its
  // order, each tensor once (a tied one under its first name; a frozen one's shard does not require
  // grad), through plain submodules named by the path.
  void register_shards(torch::nn::Module& wrapper) const;
  // Also what a forward prepared for a backward that has not started yet.
  void set_require_sync(bool sync) override;
  bool require_sync() const override;
  // FSDP2's controls (cpprun/fsdp.h says what each means).
  void set_requires_all_reduce(bool all_reduce) override;
  bool requires_all_reduce() const override;
  void unshard();
  void reshard();
  void set_reshard_after_forward(bool on);
  void set_reshard_after_backward(bool on);
  void set_gradient_divide_factor(double factor);
  void set_force_sum_reduction_for_comms(bool enable);
  void set_all_reduce_hook(std::function<void(const at::Tensor&)> hook);
  // A pipeline stage: forwards run as under no_sync, and finalize_backward() reduces (and, at
  // stage 3, releases) once a step.
  void set_manual_finalization(bool on) override;
  void finalize_backward() override;
  const ProcessGroup* shard_group() const override;
  double clip_grad_norm(double max_norm, double norm_type, bool error_if_nonfinite) override;
  const ProcessGroup& group() const override;

  FsdpMemory memory() const;
  FsdpPrefetchStats prefetch_stats() const;
  std::size_t unit_count() const;            // wrapped modules (the root included)
  std::size_t bucket_count() const;  // one per unit, dtype and requires_grad (frozen parameters apart)
  // Each parameter as its shard's rows (the fp32 master under mixed precision); after a load the
  // full parameters are remade from the shards.
  void describe_state(StateView& view) override;

  const FsdpOptions& options() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cpprun::detail
