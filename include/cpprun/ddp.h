// cpprun::DistributedDataParallel: wraps a torch::nn::Module so that backward() leaves in every
// rank's .grad the gradients averaged over all ranks, reduced in buckets while backward runs.
//
//   auto model = cpprun::DistributedDataParallel(net, group);   // net: std::shared_ptr<Net> or a holder
//   auto model = cpprun::DistributedDataParallel(net);          // the default group, as PyTorch's DDP(net)
//   torch::optim::SGD opt(model->parameters(), 0.1);
//   auto loss = loss_fn(model->forward(x), y);
//   loss.backward();                                             // gradients averaged here
//   opt.step();
//
// It is a cpprun::DataParallel (data_parallel.h): forward, no_sync, process_group,
// clip_grad_norm, ... as FullyShardedDataParallel has them.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <functional>
#include <memory>
#include <utility>

#include "cpprun/comm_hooks.h"
#include "cpprun/data_parallel.h"
#include "cpprun/ddp_options.h"
#include "cpprun/detail/ddp_core.h"
#include "cpprun/process_group.h"

namespace cpprun {

template <typename ModuleType>
class DistributedDataParallelImpl : public DataParallelImpl<ModuleType> {
  using Base = DataParallelImpl<ModuleType>;

 public:
  DistributedDataParallelImpl(std::shared_ptr<ModuleType> module, ProcessGroup group, DdpOptions options = {})
      : Base(module, std::make_unique<detail::DdpCore>(*module, std::move(group), std::move(options))) {
    this->register_module("module", module);
  }
  // Over the default group (init_process_group()'s), as PyTorch's process_group=None.
  explicit DistributedDataParallelImpl(std::shared_ptr<ModuleType> module, DdpOptions options = {})
      : DistributedDataParallelImpl(std::move(module), default_group(), std::move(options)) {}

  void register_comm_hook(std::shared_ptr<CommHook> hook) { ddp_core().register_comm_hook(std::move(hook)); }

  // Uneven inputs: runs `train_loop` (this rank's iterations, however many); a rank whose loop
  // ends first keeps taking part in the others' gradient reductions (with zero gradients) until
  // every rank's loop has ended, as PyTorch's `with Join([model]):`.
  void join(const std::function<void()>& train_loop) { ddp_core().join(train_loop); }

  const DdpOptions& options() const { return ddp_core().options(); }

 private:
  detail::DdpCore& ddp_core() const { return static_cast<detail::DdpCore&>(Base::core()); }
};

template <typename ModuleType>
class DistributedDataParallel : public torch::nn::ModuleHolder<DistributedDataParallelImpl<ModuleType>> {
  using Holder = torch::nn::ModuleHolder<DistributedDataParallelImpl<ModuleType>>;

 public:
  DistributedDataParallel(std::shared_ptr<ModuleType> module, ProcessGroup group, DdpOptions options = {})
      : Holder(std::make_shared<DistributedDataParallelImpl<ModuleType>>(std::move(module), std::move(group),
                                                                         std::move(options))) {}
  DistributedDataParallel(const torch::nn::ModuleHolder<ModuleType>& module, ProcessGroup group,
                          DdpOptions options = {})
      : DistributedDataParallel(module.ptr(), std::move(group), std::move(options)) {}
  // Over the default group, as PyTorch's DistributedDataParallel(module).
  explicit DistributedDataParallel(std::shared_ptr<ModuleType> module, DdpOptions options = {})
      : DistributedDataParallel(std::move(module), default_group(), std::move(options)) {}
  explicit DistributedDataParallel(const torch::nn::ModuleHolder<ModuleType>& module, DdpOptions options = {})
      : DistributedDataParallel(module.ptr(), default_group(), std::move(options)) {}
};

template <typename ModuleType>
DistributedDataParallel(std::shared_ptr<ModuleType>, ProcessGroup, DdpOptions = {})
    -> DistributedDataParallel<ModuleType>;
template <typename ModuleType>
DistributedDataParallel(torch::nn::ModuleHolder<ModuleType>, ProcessGroup, DdpOptions = {})
    -> DistributedDataParallel<ModuleType>;
template <typename ModuleType>
DistributedDataParallel(std::shared_ptr<ModuleType>, DdpOptions = {}) -> DistributedDataParallel<ModuleType>;
template <typename ModuleType>
DistributedDataParallel(torch::nn::ModuleHolder<ModuleType>, DdpOptions = {}) -> DistributedDataParallel<ModuleType>;

}  // namespace cpprun
