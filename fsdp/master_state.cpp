// See master_state.h.
#include "fsdp/master_state.h"

#include <ATen/ATen.h>

#include <map>
#include <unordered_map>

#include "core/state_dict.h"
#include "fsdp/optimizer_params.h"

namespace cpprun::detail {

NamedTensors gather_master_state(torch::nn::Module& module, const std::vector<ParamBucket>& buckets,
                                 const ProcessGroup& shard_group) {
  at::NoGradGuard no_grad;
  // The whole-tensor gather the optimizer's state uses (the same rows, the same order).
  const OptimizerParams params = fsdp_optimizer_params(buckets, shard_group);
  std::unordered_map<const c10::TensorImpl*, at::Tensor> whole;  // the module's parameter -> its master
  std::size_t i = 0;
  for (const ParamBucket& bucket : buckets) {
    for (const ShardedParam& s : bucket.params()) {
      // Offloaded shards live on the CPU; the group's backend wants the compute device.
      whole[s.param.unsafeGetTensorImpl()] = params.gather(i++, s.shard.detach().to(s.param.device()));
    }
  }
  NamedTensors state = module_state(module);
  for (auto& [name, tensor] : state) {
    const auto found = whole.find(tensor.unsafeGetTensorImpl());
    if (found != whole.end()) tensor = found->second;  // a tied parameter's names share one
  }
  return state;
}

void scatter_master_state(const NamedTensors& state, const std::vector<ParamBucket>& buckets,
                          const ProcessGroup& shard_group) {
  at::NoGradGuard no_grad;
  const OptimizerParams params = fsdp_optimizer_params(buckets, shard_group);  // its local_part: our rows
  std::map<std::string, const at::Tensor*> by_name;
  for (const auto& [name, tensor] : state) by_name.emplace(name, &tensor);
  std::size_t i = 0;
  for (const ParamBucket& bucket : buckets) {
    for (const ShardedParam& s : bucket.params()) {
      const auto found = by_name.find(s.name);
      TORCH_INTERNAL_ASSERT(found != by_name.end(), "no master for FSDP parameter ", s.name);
      s.shard.detach().copy_(params.local_part(i++, *found->second));
    }
  }
}

}  // namespace cpprun::detail
