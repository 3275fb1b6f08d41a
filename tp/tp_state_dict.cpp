// tensor_parallel_full_state_dict (cpprun/tensor_parallel.h): each tensor-parallel module says
// which of its parameters are split along which dimension (cpprun/tensor_parallel_split.h); those
// are all-gathered, the rest copied.
#include <ATen/ATen.h>

#include "core/tensor_parallel_state.h"
#include "cpprun/tensor_parallel.h"

namespace cpprun {

torch::OrderedDict<std::string, at::Tensor> tensor_parallel_full_state_dict(torch::nn::Module& module) {
  const auto splits = tensor_parallel_splits(module);
  torch::OrderedDict<std::string, at::Tensor> dict;
  at::NoGradGuard no_grad;
  for (const auto& item : module.named_parameters()) {
    const auto split = splits.find(item.key());
    const at::Tensor value = item.value().detach();
    dict.insert(item.key(), split == splits.end() ? value.clone()
                                                  : detail::gather_tensor_parallel_split(value, split->second));
  }
  for (const auto& item : module.named_buffers()) dict.insert(item.key(), item.value().detach().clone());
  return dict;
}

}  // namespace cpprun
