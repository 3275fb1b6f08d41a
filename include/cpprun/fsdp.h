// cpprun::FullyShardedDataParallel: ZeRO data parallelism with per-parameter sharding, as
// PyTorch's FSDP2 (fully_shard). Each parameter is split on dim 0 across the ranks (padded to a
// multiple of their number); each rank keeps its rows of every parameter, and with them its part
// of the optimizer state (stage 1), of the gradients (stage 2) and of the parameters (stage 3).
//
//   auto model = cpprun::FullyShardedDataParallel(net, group, cpprun::FsdpOptions().stage(2));
//   auto model = cpprun::FullyShardedDataParallel(net);    // every rank of the default group
//   torch::optim::AdamW opt(model->parameters(), 1e-3);   // this rank's shards, by name
//   loss_fn(model->forward(x), y).backward();              // gradients reduce-scattered
//   opt.step();                                            // each rank steps its shards
//
// model->named_parameters() are the shards under the wrapped module's own names
// ("blocks.0.fc1.weight", ...), in its order, each tensor once (as Python lists them; a tied
// weight under its first name): optimizer parameter groups are built from them as
// from the unwrapped module (docs/fsdp.md, "Optimizer parameter groups"). The units (wrapped modules
// whose parameters are gathered together) still move one all-gather and one reduce-scatter per
// unit and dtype. Stages 1 and 2 all-gather the full parameters before the next forward; stage 3
// gathers each unit just before an operator uses it and releases it after (see FsdpOptions).
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstddef>
#include <functional>
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
  // Over the default group (init_process_group()'s), as FSDP2's fully_shard(module) without a mesh.
  explicit FullyShardedDataParallelImpl(std::shared_ptr<ModuleType> module, FsdpOptions options = {})
      : FullyShardedDataParallelImpl(std::move(module), default_group(), std::move(options)) {}
  // A 1-D mesh: shards over it. A 2-D mesh: HSDP (hybrid sharding) shards over one dimension
  // (FsdpOptions::shard_dim, default the last) and replicates over the other: each rank holds
  // 1/size(shard_dim) of the model, the ranks with the same shard coordinate the same rows;
  // gradients are reduce-scattered within the shard group, then each
  // shard's gradient is averaged across the replicas. With a {nodes, local} mesh
  // (node_local_mesh()), only Ψ/local gradient elements per step cross nodes.
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

  // FSDP2's FSDPModule controls, under its names and meanings (torch/distributed/fsdp/
  // _fully_shard/_fully_shard.py), on every rank alike. Each applies to the whole wrapper, every
  // unit in it: FSDP2's on the root with recurse=True (cpprun has one wrapper, so no `recurse`).
  // What FSDP2 offers and these do not is listed in docs/fsdp.md.

  // Whether backward reduces the gradients across ranks; it stays so until set again. false:
  // each backward accumulates its gradients locally (in the full parameters' .grad, the shards'
  // gradients untouched), and the first backward after set_requires_gradient_sync(true) reduces
  // the sum, as FSDP2's. Read when backward starts, as FSDP2 reads it in backward: set between a
  // forward and its backward, it applies to that backward. It also sets
  // set_requires_all_reduce(requires_gradient_sync), as FSDP2's does.
  // It is the setting no_sync() switches: a guard sets it false and, when it ends, puts back the
  // value it found (a set_requires_gradient_sync() made while a guard lives lasts only until the
  // guard ends; a guard made while it is false changes nothing).
  void set_requires_gradient_sync(bool requires_gradient_sync) {
    fsdp_core().set_require_sync(requires_gradient_sync);
    fsdp_core().set_requires_all_reduce(requires_gradient_sync);
  }
  // HSDP: whether a synchronized backward also averages the gradients across the replicas.
  // false: each backward still reduces within the shard group, but its result is set aside
  // (summed over such backwards) rather than all-reduced, and the shards' gradients stay as they
  // were; the next backward with it true adds the set-aside sum before its one all-reduce. As
  // FSDP2's: gradient accumulation with reduce-scatters and a single all-reduce. Set it true
  // before the backward that precedes clipping or an optimizer step. Without replicas (a 1-D
  // mesh or group) there is no all-reduce: it has no effect, as FSDP2's.
  void set_requires_all_reduce(bool requires_all_reduce) { fsdp_core().set_requires_all_reduce(requires_all_reduce); }
  // Stage 3: every unit all-gathered now, from the current shards (in param_dtype under mixed
  // precision), to use module() directly; they stay gathered, past gathered_unit_limit, until a
  // forward's end releases them (reshard_after_forward) or reshard(). The next forward uses them
  // without gathering, as FSDP2's, unless they were gathered between a synchronized backward and
  // that forward, where the optimizer steps: then it gathers anew (LibTorch's optimizers step
  // through .data(), unseen; FSDP2 would use the stale ones). Stages 1 and 2 keep the full
  // parameters always: it brings them up to date after an optimizer step (the next forward
  // gathers them again, for the same reason). Collective; the same as gather_full_parameters().
  void unshard() { fsdp_core().unshard(); }
  // Stage 3: every gathered unit released now, and the memory kept for reuse freed
  // (memory().parameters and .kept are 0 after it). Stages 1 and 2, and stage 3 alone in its
  // shard group without mixed precision or offload (Note [Nothing to shard alone]), hold the full
  // parameters as their working state: nothing to release, nothing done. It communicates nothing,
  // but call it on every rank alike: what it releases, the next forward all-gathers.
  void reshard() { fsdp_core().reshard(); }
  // Stage 3: whether forward releases the units it gathered (FsdpOptions::reshard_after_forward,
  // changed from now on; options() shows it). false also keeps them after a forward without
  // autograd, so that repeated evaluation forwards gather once (when the units fit in
  // gathered_unit_limit; past it the least recently used are released), as FSDP2's. Stages 1 and 2 never
  // release: false is accepted (it is what they do), true is an error.
  void set_reshard_after_forward(bool reshard_after_forward) {
    fsdp_core().set_reshard_after_forward(reshard_after_forward);
  }
  // Stage 3: whether backward releases each unit once its gradients are produced (true by
  // default, in synchronized and local backwards alike, as FSDP2's). false keeps them gathered
  // after backward (within gathered_unit_limit), so that the next forward of a gradient
  // accumulation gathers nothing again: memory for communication. Unlike FSDP2, no reshard() is
  // needed before the optimizer step: units gathered before a synchronized backward's next
  // forward (or before a checkpoint load) are taken to be stepped, and gathered anew. A pipeline stage's micro-batch backwards keep their units regardless (as PyTorch's
  // schedules set it false for them); the step's finalization then follows this setting.
  // Stages 1 and 2 never release: false is accepted, true is an error.
  void set_reshard_after_backward(bool reshard_after_backward) {
    fsdp_core().set_reshard_after_backward(reshard_after_backward);
  }
  // FSDP2's set_gradient_divide_factor: each synchronized backward's reduction gives the sum of
  // every rank's gradient divided by `factor` (HSDP: every rank of both dimensions) rather than
  // their average (the default: factor = the data-parallel size). E.g. the world size times the
  // micro-batches, or a loss summed over tokens divided by their global count. Persists; read as
  // each unit's reduction starts. The division happens where FSDP2's does (before and after the
  // collectives, by its rules for each reduce dtype: docs/fsdp.md), so the bits match its.
  // A factor that is not positive and finite is an error.
  void set_gradient_divide_factor(double factor) { fsdp_core().set_gradient_divide_factor(factor); }
  // FSDP2's set_force_sum_reduction_for_comms (default false): the collectives only sum, with the
  // division done apart (float32 and bfloat16 otherwise average in the collective, and a divide
  // factor multiplies before it). The same values up to rounding; FSDP2 offers it for NCCL's
  // zero-copy sums, here it gives its arithmetic, bit for bit.
  void set_force_sum_reduction_for_comms(bool enable) { fsdp_core().set_force_sum_reduction_for_comms(enable); }
  // FSDP2's set_all_reduce_hook: `hook(reduce_output)` runs in each synchronized backward once per
  // unit and dtype, with this rank's reduced gradient rows (1-D, in the reduce dtype, every
  // parameter's rows end to end as the wire carries them, zero-padded): after the reduce-scatter
  // (HSDP: after the replicas' all-reduce), before the division that follows them (see
  // set_gradient_divide_factor), and it may change them in place, e.g. all-reduce them over a
  // group of its own. Not called where HSDP's all-reduce is off (set_requires_all_reduce(false)),
  // as FSDP2's. It runs inside backward: it must not call this wrapper. An empty function
  // removes it. (FSDP2's `stream` argument has no CPU counterpart.)
  void set_all_reduce_hook(std::function<void(const at::Tensor&)> hook) {
    fsdp_core().set_all_reduce_hook(std::move(hook));
  }

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
  // Over the default group, as FSDP2's fully_shard(module).
  explicit FullyShardedDataParallel(std::shared_ptr<ModuleType> module, FsdpOptions options = {})
      : FullyShardedDataParallel(std::move(module), default_group(), std::move(options)) {}
  explicit FullyShardedDataParallel(const torch::nn::ModuleHolder<ModuleType>& module, FsdpOptions options = {})
      : FullyShardedDataParallel(module.ptr(), default_group(), std::move(options)) {}
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
template <typename ModuleType>
FullyShardedDataParallel(std::shared_ptr<ModuleType>, FsdpOptions = {}) -> FullyShardedDataParallel<ModuleType>;
template <typename ModuleType>
FullyShardedDataParallel(torch::nn::ModuleHolder<ModuleType>, FsdpOptions = {})
    -> FullyShardedDataParallel<ModuleType>;

}  // namespace cpprun
