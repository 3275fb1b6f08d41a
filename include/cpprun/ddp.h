// cpprun::DistributedDataParallel: wraps a torch::nn::Module so that backward() leaves in every
// rank's .grad the gradients averaged over all ranks, reduced in buckets while backward runs.
//
//   auto model = cpprun::DistributedDataParallel(net, group);   // net: std::shared_ptr<Net> or a holder
//   torch::optim::SGD opt(model->parameters(), 0.1);
//   auto loss = loss_fn(model->forward(x), y);
//   loss.backward();                                             // gradients averaged here
//   opt.step();
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <memory>
#include <utility>

#include "cpprun/comm_hooks.h"
#include "cpprun/ddp_options.h"
#include "cpprun/detail/ddp_core.h"
#include "cpprun/no_sync.h"
#include "cpprun/process_group.h"

namespace cpprun {

template <typename ModuleType>
class DistributedDataParallelImpl : public torch::nn::Module {
 public:
  DistributedDataParallelImpl(std::shared_ptr<ModuleType> module, ProcessGroup group, DdpOptions options = {})
      : module_(register_module("module", std::move(module))),
        core_(std::make_unique<detail::DdpCore>(*module_, std::move(group), std::move(options))) {}

  // Calls the wrapped module's forward with the same arguments.
  template <typename... Args>
  decltype(auto) forward(Args&&... args) {
    core_->before_forward();
    decltype(auto) output = module_->forward(std::forward<Args>(args)...);
    std::vector<at::Tensor> tensors;
    detail::collect_tensors(output, tensors);
    core_->after_forward(tensors);
    return output;
  }

  std::shared_ptr<ModuleType> module() const { return module_; }
  NoSyncGuard no_sync() { return NoSyncGuard(*core_); }
  void register_comm_hook(std::shared_ptr<CommHook> hook) { core_->register_comm_hook(std::move(hook)); }

  // Uneven inputs: runs `train_loop` (this rank's iterations, however many); a rank whose loop
  // ends first keeps taking part in the others' gradient reductions (with zero gradients) until
  // every rank's loop has ended, as PyTorch's `with Join([model]):`.
  void join(const std::function<void()>& train_loop) { core_->join(train_loop); }

  const ProcessGroup& process_group() const { return core_->group(); }
  const DdpOptions& options() const { return core_->options(); }

 private:
  std::shared_ptr<ModuleType> module_;
  std::unique_ptr<detail::DdpCore> core_;
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
};

template <typename ModuleType>
DistributedDataParallel(std::shared_ptr<ModuleType>, ProcessGroup, DdpOptions = {})
    -> DistributedDataParallel<ModuleType>;
template <typename ModuleType>
DistributedDataParallel(torch::nn::ModuleHolder<ModuleType>, ProcessGroup, DdpOptions = {})
    -> DistributedDataParallel<ModuleType>;

}  // namespace cpprun
