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

#include <memory>
#include <string>
#include <type_traits>
#include <utility>

#include "cpprun/detail/fsdp_core.h"
#include "cpprun/fsdp_options.h"
#include "cpprun/no_sync.h"
#include "cpprun/process_group.h"

namespace cpprun {

template <typename ModuleType>
class FullyShardedDataParallelImpl : public torch::nn::Module {
 public:
  FullyShardedDataParallelImpl(std::shared_ptr<ModuleType> module, ProcessGroup group, FsdpOptions options = {})
      : module_(std::move(module)),
        core_(std::make_unique<detail::FsdpCore>(*module_, std::move(group), std::move(options))) {
    // The wrapped module is deliberately not a submodule: parameters() must be the shards.
    const auto shards = core_->shards();
    for (std::size_t i = 0; i < shards.size(); ++i) register_parameter("shard_" + std::to_string(i), shards[i]);
  }

  template <typename... Args>
  decltype(auto) forward(Args&&... args) {
    core_->before_forward();
    decltype(auto) output = module_->forward(cast_input(std::forward<Args>(args))...);
    core_->after_forward();
    return output;
  }

  void train(bool on = true) override {
    torch::nn::Module::train(on);
    module_->train(on);
  }

  std::shared_ptr<ModuleType> module() const { return module_; }
  // After optimizer.step(), brings module()'s full parameters up to date now rather than at the
  // next forward (e.g. to inspect or evaluate module() directly). Stage 3: gathers every unit
  // until the next forward. Collective. (Under stage 3, touching module()'s parameters without
  // this gathers their unit, a collective: do it on every rank.)
  void gather_full_parameters() { core_->gather_full_parameters(); }
  NoSyncGuard no_sync() { return NoSyncGuard(*core_); }
  // Scales this rank's shard gradients so that the norm of all gradients, over every rank, is
  // at most max_norm; returns that norm before clipping. Collective.
  double clip_grad_norm(double max_norm) { return core_->clip_grad_norm(max_norm); }
  detail::FsdpMemory memory() const { return core_->memory(); }
  std::size_t unit_count() const { return core_->unit_count(); }
  detail::FsdpCore& core() { return *core_; }

 private:
  // Tensors go through the core (mixed precision casts them); other arguments pass as they are.
  template <typename T>
  decltype(auto) cast_input(T&& arg) {
    if constexpr (std::is_same_v<std::decay_t<T>, at::Tensor>) {
      return core_->cast_input(arg);
    } else {
      return std::forward<T>(arg);
    }
  }

  std::shared_ptr<ModuleType> module_;
  std::unique_ptr<detail::FsdpCore> core_;
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

// The full model, in torch::save's format for the wrapped module: a plain, unwrapped module of
// the same type loads it with torch::load(module, path). Rank 0 writes it atomically, with a
// checksum (cpprun/checkpoint_file.h); if it cannot, every rank throws. Collective.
template <typename ModuleType>
void save_full_state_dict(FullyShardedDataParallel<ModuleType>& model, const std::string& path) {
  model->core().save_full_state(path);
}
// The reverse: a file written by torch::save(module, path) or save_full_state_dict. Only rank 0
// reads it; the values are broadcast. A file save_full_state_dict wrote is checked first: a
// damaged one is refused (cpprun::CorruptCheckpointError naming it on rank 0; an error on the
// others). Collective.
template <typename ModuleType>
void load_full_state_dict(FullyShardedDataParallel<ModuleType>& model, const std::string& path) {
  model->core().load_full_state(path);
}

// Sharded checkpoint: each rank writes DIR/rank_<r>.pt with its shards and their optimizer state
// (SGD, Adam, AdamW), in parallel; rank 0 writes DIR/meta.pt last. Each file is written atomically
// with a checksum, verified on load: a damaged file is refused with an error naming it, on the
// rank that read it, and every other rank throws too. It loads at any world size: the saved shards
// are cut anew. Collective.
template <typename ModuleType>
void save_sharded_checkpoint(FullyShardedDataParallel<ModuleType>& model, torch::optim::Optimizer& optimizer,
                             const std::string& dir) {
  model->core().save_sharded(dir, &optimizer);
}
template <typename ModuleType>
void load_sharded_checkpoint(FullyShardedDataParallel<ModuleType>& model, torch::optim::Optimizer& optimizer,
                             const std::string& dir) {
  model->core().load_sharded(dir, &optimizer);
}

}  // namespace cpprun
