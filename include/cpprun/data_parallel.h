// cpprun::DataParallel: what DistributedDataParallel and FullyShardedDataParallel both offer, so
// that a training loop written once runs under either; choosing is one line:
//
//   cpprun::DataParallel<Net> model = cpprun::DistributedDataParallel(net, group);
//   // cpprun::DataParallel<Net> model = cpprun::FullyShardedDataParallel(net, group, cpprun::FsdpOptions().stage(3));
//   torch::optim::AdamW opt(model->parameters(), 1e-3);   // FSDP: this rank's shards
//   auto loss = loss_fn(model->forward(x), y);             // Net's own forward signature
//   loss.backward();
//   model->clip_grad_norm(1.0);
//   opt.step();
//
// DataParallel<Net> is a module holder like LibTorch's own (model->..., a shared handle);
// what only one of the two offers (DDP's join() and comm hooks, FSDP's memory()) stays on it.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstddef>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "cpprun/detail/data_parallel_core.h"
#include "cpprun/no_sync.h"
#include "cpprun/process_group.h"

namespace cpprun {

template <typename ModuleType>
class DistributedDataParallelImpl;
template <typename ModuleType>
class FullyShardedDataParallelImpl;
template <typename ModuleType>
class DataParallelImpl;

namespace detail {
// How the checkpoint functions (model_checkpoint.h) reach any wrapper's core.
struct DataParallelAccess {
  template <typename ModuleType>
  static DataParallelCore& core(DataParallelImpl<ModuleType>& model) {
    return model.core();
  }
};
}  // namespace detail

template <typename ModuleType>
class DataParallelImpl : public torch::nn::Module {
 public:
  // Calls the wrapped module's forward with the same arguments and returns what it returns.
  template <typename... Args>
  decltype(auto) forward(Args&&... args) {
    core_->before_forward();
    auto output = module_->forward(cast_input(std::forward<Args>(args))...);
    std::vector<at::Tensor> tensors;
    detail::for_each_output(output, [&](at::Tensor& t) {
      t = core_->cast_output(t);  // FSDP's output_dtype
      tensors.push_back(t);
    });
    core_->after_forward(tensors);
    return output;
  }

  // The wrapped module. Under FSDP its parameters are current after gather_full_parameters().
  std::shared_ptr<ModuleType> module() const { return module_; }
  // Backward passes while the guard lives accumulate local gradients only (see no_sync.h).
  NoSyncGuard no_sync() { return NoSyncGuard(*core_); }
  const ProcessGroup& process_group() const { return core_->group(); }
  // Scales the gradients so that the norm of all of them together (every rank's shard, under
  // FSDP) is at most max_norm; returns that norm before clipping, the same on every rank, as
  // Python's torch.nn.utils.clip_grad_norm_ on the unwrapped model would (DDP: the same
  // gradients to the bit). norm_type: 2, 1, any p > 0, or infinity (the largest magnitude);
  // error_if_nonfinite: throw, changing nothing, when the norm is NaN or infinite (off: every
  // gradient is multiplied by NaN, or by 0, as PyTorch's). Call it between backward and the
  // optimizer step, on every rank (FSDP: collective).
  double clip_grad_norm(double max_norm, double norm_type = 2.0, bool error_if_nonfinite = false) {
    return core_->clip_grad_norm(max_norm, norm_type, error_if_nonfinite);
  }
  // After optimizer.step(): brings module()'s full parameters up to date now rather than at the
  // next forward (e.g. to evaluate or sample from module() directly). DDP: nothing to do. FSDP:
  // collective; under stage 3 every unit stays gathered until a forward releases it (FSDP's
  // unshard() does the same; see fsdp.h). Called before the step, the next forward still sees
  // the stepped parameters (gathered again).
  void gather_full_parameters() { core_->gather_full_parameters(); }

  ~DataParallelImpl() override { detail::unregister_data_parallel(*this); }

  void train(bool on = true) override {
    torch::nn::Module::train(on);
    module_->train(on);
  }

 private:
  friend class DistributedDataParallelImpl<ModuleType>;
  friend class FullyShardedDataParallelImpl<ModuleType>;
  friend struct detail::DataParallelAccess;
  DataParallelImpl(std::shared_ptr<ModuleType> module, std::unique_ptr<detail::DataParallelCore> core)
      : module_(std::move(module)), core_(std::move(core)) {
    detail::register_data_parallel(*this, *core_);
  }
  detail::DataParallelCore& core() const { return *core_; }

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
  std::unique_ptr<detail::DataParallelCore> core_;
};

// A DistributedDataParallel<ModuleType> or a FullyShardedDataParallel<ModuleType>, whichever it
// was made from.
template <typename ModuleType>
class DataParallel : public torch::nn::ModuleHolder<DataParallelImpl<ModuleType>> {
  using Holder = torch::nn::ModuleHolder<DataParallelImpl<ModuleType>>;

 public:
  DataParallel(std::nullptr_t) : Holder(nullptr) {}
  DataParallel(std::shared_ptr<DataParallelImpl<ModuleType>> impl) : Holder(std::move(impl)) {}
  template <typename Impl, typename = std::enable_if_t<std::is_base_of_v<DataParallelImpl<ModuleType>, Impl>>>
  DataParallel(const torch::nn::ModuleHolder<Impl>& wrapper)
      : Holder(std::shared_ptr<DataParallelImpl<ModuleType>>(wrapper.ptr())) {}
};

}  // namespace cpprun
