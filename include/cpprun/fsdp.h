// cpprun::FullyShardedDataParallel: ZeRO data parallelism. Each rank keeps only its shard
// (1/world_size) of the optimizer state (stage 1), of the gradients (stage 2) and of the
// parameters (stage 3).
//
//   auto model = cpprun::FullyShardedDataParallel(net, group, cpprun::FsdpOptions().stage(2));
//   torch::optim::AdamW opt(model->parameters(), 1e-3);   // this rank's shards
//   loss_fn(model->forward(x), y).backward();              // gradients reduce-scattered
//   opt.step();                                            // each rank steps its shard
//
// model->parameters() are the shards, so optimizer state is sharded by construction. Stages 1
// and 2 all-gather the full parameters before the next forward; stage 3 gathers each unit just
// before an operator uses it and releases it after (see FsdpOptions).
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/optim/optimizer.h>

#include <cstddef>
#include <memory>
#include <string>
#include <utility>

#include "cpprun/data_parallel.h"
#include "cpprun/detail/fsdp_core.h"
#include "cpprun/fsdp_options.h"
#include "cpprun/fsdp_stats.h"
#include "cpprun/process_group.h"

namespace cpprun {
namespace detail {
struct FsdpAccess;
}  // namespace detail

// A cpprun::DataParallel (data_parallel.h): forward, no_sync, process_group, clip_grad_norm,
// gather_full_parameters, ... as DistributedDataParallel has them.
template <typename ModuleType>
class FullyShardedDataParallelImpl : public DataParallelImpl<ModuleType> {
  using Base = DataParallelImpl<ModuleType>;

 public:
  FullyShardedDataParallelImpl(std::shared_ptr<ModuleType> module, ProcessGroup group, FsdpOptions options = {})
      : Base(module, std::make_unique<detail::FsdpCore>(*module, std::move(group), std::move(options))) {
    // The wrapped module is deliberately not a submodule: parameters() must be the shards.
    const auto shards = fsdp_core().shards();
    for (std::size_t i = 0; i < shards.size(); ++i) this->register_parameter("shard_" + std::to_string(i), shards[i]);
  }

  // Bytes of parameters, shards and gradients this rank holds (see fsdp_stats.h).
  FsdpMemory memory() const { return fsdp_core().memory(); }
  // Stage 3: how many gathers were started ahead of use, and how many of those were used.
  FsdpPrefetchStats prefetch_stats() const { return fsdp_core().prefetch_stats(); }
  // Units: the wrapped modules whose parameters are gathered and released together (see
  // FsdpOptions::wrap_policy), the root module's own parameters being one. Each unit's parameters
  // are flattened into one flat parameter per dtype, of which this rank holds a shard.
  std::size_t unit_count() const { return fsdp_core().unit_count(); }
  std::size_t flat_parameter_count() const { return fsdp_core().flat_parameter_count(); }
  const FsdpOptions& options() const { return fsdp_core().options(); }

 private:
  friend struct detail::FsdpAccess;
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
};

template <typename ModuleType>
FullyShardedDataParallel(std::shared_ptr<ModuleType>, ProcessGroup, FsdpOptions = {})
    -> FullyShardedDataParallel<ModuleType>;
template <typename ModuleType>
FullyShardedDataParallel(torch::nn::ModuleHolder<ModuleType>, ProcessGroup, FsdpOptions = {})
    -> FullyShardedDataParallel<ModuleType>;

namespace detail {
// The checkpoint functions' way to the core (users cannot reach it).
struct FsdpAccess {
  template <typename ModuleType>
  static FsdpCore& core(FullyShardedDataParallel<ModuleType>& model) {
    return model->fsdp_core();
  }
};
}  // namespace detail

// The full model, in torch::save's format for the wrapped module: a plain, unwrapped module of
// the same type loads it with torch::load(module, path). Rank 0 writes it atomically, with a
// checksum (cpprun/checkpoint_file.h); if it cannot, every rank throws. Collective.
template <typename ModuleType>
void save_full_state_dict(FullyShardedDataParallel<ModuleType>& model, const std::string& path) {
  detail::FsdpAccess::core(model).save_full_state(path);
}
// The reverse: a file written by torch::save(module, path) or save_full_state_dict. Only rank 0
// reads it; the values are broadcast. A file save_full_state_dict wrote is checked first: a
// damaged one is refused (cpprun::CorruptCheckpointError naming it on rank 0; an error on the
// others). Collective.
template <typename ModuleType>
void load_full_state_dict(FullyShardedDataParallel<ModuleType>& model, const std::string& path) {
  detail::FsdpAccess::core(model).load_full_state(path);
}

// Sharded checkpoint: each rank writes DIR/rank_<r>.pt with its shards and their optimizer state
// (SGD, Adam, AdamW), in parallel; rank 0 writes DIR/meta.pt last. Under HSDP (FsdpOptions::mesh)
// only the first replica writes, r being the rank in the shard group, and every replica loads:
// the files are those plain FSDP over the shard group would write. Each file is written atomically
// with a checksum, verified on load: a damaged file is refused with an error naming it, on the
// rank that read it, and every other rank throws too. It loads at any world size: the saved shards
// are cut anew. Collective.
template <typename ModuleType>
void save_sharded_checkpoint(FullyShardedDataParallel<ModuleType>& model, torch::optim::Optimizer& optimizer,
                             const std::string& dir) {
  detail::FsdpAccess::core(model).save_sharded(dir, &optimizer);
}
template <typename ModuleType>
void load_sharded_checkpoint(FullyShardedDataParallel<ModuleType>& model, torch::optim::Optimizer& optimizer,
                             const std::string& dir) {
  detail::FsdpAccess::core(model).load_sharded(dir, &optimizer);
}

}  // namespace cpprun
