// See split_parameter_registry.h.
#include "core/split_parameter_registry.h"

#include <c10/core/TensorImpl.h>
#include <c10/core/UndefinedTensorImpl.h>
#include <c10/util/intrusive_ptr.h>

#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

namespace cpprun::detail {
namespace {

// Note [Split parameters in a parameter list]
// PyTorch's clip_grad_norm_(model.parameters()) on a parallelize_module'd model takes the whole
// model's norm: the parameters are DTensors, and a sharded one's norm is combined over its mesh
// (torch/nn/utils/clip_grad.py). Ours are plain tensors, so a list says nothing of which are
// shards, and the norm would be each rank's own (an audit at 2 ranks: 1.62 where the whole's is
// 2.08, the ranks scaling by different factors and the replicated LayerNorm drifting apart). So
// the tensor-parallel modules note their split parameters here, by tensor, while they live; the
// list's clip_grad_norm_ looks each parameter up and combines as the module overload does. An
// entry holds a weak reference to its tensor, so the address it is keyed by cannot be reused by
// another tensor while the entry exists, and a replaced parameter's entry only lingers (unused)
// until the next registration sweeps it.
using WeakTensorImpl = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;

struct SplitEntry {
  WeakTensorImpl tensor;
  const TensorParallelModule* owner = nullptr;
  std::string name;  // in the owner's tensor_parallel_splits()
};

std::mutex& split_registry_mutex() {
  static auto* mutex = new std::mutex;  // never destroyed: modules may outlive static destruction
  return *mutex;
}
std::unordered_map<const c10::TensorImpl*, SplitEntry>& split_registry() {
  static auto* entries = new std::unordered_map<const c10::TensorImpl*, SplitEntry>;
  return *entries;
}

void note_tree(torch::nn::Module& module) {
  if (const auto* owner = dynamic_cast<const TensorParallelModule*>(&module)) register_split_parameters(*owner, module);
}

}  // namespace

void register_split_parameters(const TensorParallelModule& owner, const torch::nn::Module& module) {
  const auto splits = owner.tensor_parallel_splits();
  const auto params = module.named_parameters(/*recurse=*/false);
  std::lock_guard<std::mutex> lock(split_registry_mutex());
  auto& entries = split_registry();
  for (auto it = entries.begin(); it != entries.end();) it = it->second.tensor.expired() ? entries.erase(it) : ++it;
  for (const auto& [name, split] : splits) {
    const at::Tensor* param = params.find(name);
    if (param == nullptr || !param->defined()) continue;
    SplitEntry entry{WeakTensorImpl(param->getIntrusivePtr()), &owner, name};
    entries.insert_or_assign(param->unsafeGetTensorImpl(), std::move(entry));
  }
}

void register_split_parameters_in(torch::nn::Module& module) {
  note_tree(module);
  for (const auto& child : module.modules(/*include_self=*/false)) note_tree(*child);
}

std::optional<ProcessGroup> split_group_of(const at::Tensor& param) {
  if (!param.defined()) return std::nullopt;
  std::lock_guard<std::mutex> lock(split_registry_mutex());
  const auto found = split_registry().find(param.unsafeGetTensorImpl());
  if (found == split_registry().end() || found->second.tensor.expired()) return std::nullopt;
  const auto splits = found->second.owner->tensor_parallel_splits();
  const auto split = splits.find(found->second.name);
  if (split == splits.end()) return std::nullopt;
  return split->second.group;
}

}  // namespace cpprun::detail

namespace cpprun {

// Forgets this module's shards (Note [Split parameters in a parameter list]).
TensorParallelModule::~TensorParallelModule() {
  std::lock_guard<std::mutex> lock(detail::split_registry_mutex());
  auto& entries = detail::split_registry();
  for (auto it = entries.begin(); it != entries.end();) it = it->second.owner == this ? entries.erase(it) : ++it;
}

}  // namespace cpprun
