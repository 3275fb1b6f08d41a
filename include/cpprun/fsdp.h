// cpprun::FullyShardedDataParallel: ZeRO data parallelism with per-parameter sharding, as
// PyTorch's FSDP2 (fully_shard). Each parameter is split on dim 0 across the ranks (padded to a
// multiple of their number); each rank keeps its rows of every parameter, and with them its part
// of the optimizer state (stage 1), of the gradients (stage 2) and of the parameters (stage 3).
//
//   auto model = cpprun::FullyShardedDataParallel(net, group, cpprun::FsdpOptions().stage(2));
//   torch::optim::AdamW opt(model->parameters(), 1e-3);   // this rank's shards, by name
//   loss_fn(model->forward(x), y).backward();              // gradients reduce-scattered
//   opt.step();                                            // each rank steps its shards
//
// model->named_parameters() are the shards under the wrapped module's own names
// ("blocks.0.fc1.weight", ...), in its order, each tensor once (as Python lists them; a tied
// weight under its first name): optimizer parameter groups are built from them as
// from the unwrapped module (README, "Optimizer parameter groups"). The units (wrapped modules
// whose parameters are gathered together) still move one all-gather and one reduce-scatter per
// unit and dtype. Stages 1 and 2 all-gather the full parameters before the next forward; stage 3
// gathers each unit just before an operator uses it and releases it after (see FsdpOptions).
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstddef>
#include <memory>
#include <optional>
#include <utility>

#include "cpprun/data_parallel.h"
#include "cpprun/detail/fsdp_core.h"
#include "cpprun/device_mesh.h"
#include "cpprun/fsdp_options.h"
#include "cpprun/fsdp_stats.h"
#include "cpprun/model_checkpoint.h"
#include "cpprun/process_group.h"

namespace cpprun {

// A cpprun::DataParallel (data_parallel.h): forward, no_sync, process_group, clip_grad_norm,
// gather_full_parameters, ... as DistributedDataParallel has them.
template <typename ModuleType>
class FullyShardedDataParallelImpl : public DataParallelImpl<ModuleType> {
  using Base = DataParallelImpl<ModuleType>;

 public:
  // Shards over every rank of `group`.
  FullyShardedDataParallelImpl(std::shared_ptr<ModuleType> module, ProcessGroup group, FsdpOptions options = {})
      : Base(module, std::make_unique<detail::FsdpCore>(*module, std::move(group), std::nullopt, std::move(options))) {
    fsdp_core().register_shards(*this);
  }
  // A 1-D mesh: shards over it. A 2-D mesh: HSDP (hybrid sharding) shards over one dimension
  // (FsdpOptions::shard_dim, default the last) and replicates over the other: each rank holds
  // 1/size(shard_dim) of the model, the ranks with the same shard coordinate the same rows;
  // gradients are reduce-scattered (stage 1: all-reduced) within the shard group, then each
  // shard's gradient is averaged across the replicas. With a {nodes, local} mesh
  // (init_device_mesh()), only Ψ/local gradient elements per step cross nodes.
  FullyShardedDataParallelImpl(std::shared_ptr<ModuleType> module, const DeviceMesh& mesh, FsdpOptions options = {})
      : Base(module, std::make_unique<detail::FsdpCore>(*module, mesh.whole(), mesh, std::move(options))) {
    fsdp_core().register_shards(*this);
  }

  // Bytes of parameters, shards and gradients this rank holds (see fsdp_stats.h).
  FsdpMemory memory() const { return fsdp_core().memory(); }
  // Stage 3: how many gathers were started ahead of use, and how many of those were used.
  FsdpPrefetchStats prefetch_stats() const { return fsdp_core().prefetch_stats(); }
  // Units: the wrapped modules whose parameters are gathered and released together (see
  // FsdpOptions::wrap_policy), the root module's own parameters being one.
  std::size_t unit_count() const { return fsdp_core().unit_count(); }
  // The collectives' buckets: one per unit and dtype (a unit whose parameters have two dtypes
  // moves two all-gathers and two reduce-scatters).
  std::size_t bucket_count() const { return fsdp_core().bucket_count(); }
  const FsdpOptions& options() const { return fsdp_core().options(); }

 private:
  detail::FsdpCore& fsdp_core() const { return static_cast<detail::FsdpCore&>(Base::core()); }
};

template <typename ModuleType>
class FullyShardedDataParallel : public torch::nn::ModuleHolder<FullyShardedDataParallelImpl<ModuleType>> {
  using Holder = torch::nn::ModuleHolder<FullyShardedDataParallelImpl<ModuleType>>;

 public:
  FullyShardedDataParallel(std::shared_ptr<ModuleType> module, ProcessGroup group, FsdpOptions options = {})
      : Holder(std::make_shared<FullyShardedDataParallelImpl<ModuleType>>(std::move(module), std::move(group),
                                                                          std::move(options))) {}
  FullyShardedDataParallel(const torch::nn::ModuleHolder<ModuleType>& module, ProcessGroup group,
                           FsdpOptions options = {})
      : FullyShardedDataParallel(module.ptr(), std::move(group), std::move(options)) {}
  FullyShardedDataParallel(std::shared_ptr<ModuleType> module, const DeviceMesh& mesh, FsdpOptions options = {})
      : Holder(std::make_shared<FullyShardedDataParallelImpl<ModuleType>>(std::move(module), mesh, std::move(options))) {}
  FullyShardedDataParallel(const torch::nn::ModuleHolder<ModuleType>& module, const DeviceMesh& mesh,
                           FsdpOptions options = {})
      : FullyShardedDataParallel(module.ptr(), mesh, std::move(options)) {}
};

template <typename ModuleType>
FullyShardedDataParallel(std::shared_ptr<ModuleType>, ProcessGroup, FsdpOptions = {})
    -> FullyShardedDataParallel<ModuleType>;
template <typename ModuleType>
FullyShardedDataParallel(torch::nn::ModuleHolder<ModuleType>, ProcessGroup, FsdpOptions = {})
    -> FullyShardedDataParallel<ModuleType>;
template <typename ModuleType>
FullyShardedDataParallel(std::shared_ptr<ModuleType>, DeviceMesh, FsdpOptions = {})
    -> FullyShardedDataParallel<ModuleType>;
template <typename ModuleType>
FullyShardedDataParallel(torch::nn::ModuleHolder<ModuleType>, DeviceMesh, FsdpOptions = {})
    -> FullyShardedDataParallel<ModuleType>;

}  // namespace cpprun
