// tensor_parallel_full_state_dict (cpprun/tensor_parallel.h): each tensor-parallel module says
// which of its parameters are split along which dimension (cpprun/tensor_parallel_split.h); those
// are all-gathered, the rest copied.
#include <ATen/ATen.h>

#include "checkpoint/state_dict.h"
#include "core/tensor_parallel_state.h"
#include "cpprun/tensor_parallel.h"

namespace cpprun {

torch::OrderedDict<std::string, at::Tensor> tensor_parallel_full_state_dict(torch::nn::Module& module) {
  const auto splits = tensor_parallel_splits(module);
  torch::OrderedDict<std::string, at::Tensor> dict;
  at::NoGradGuard no_grad;
  // In state_dict() order (Note [State dict order]), each tied tensor under each of its names.
  for (const auto& [name, tensor] : detail::module_state(module)) {
    const auto split = splits.find(name);
    const at::Tensor value = tensor.detach();
    dict.insert(name, split == splits.end() ? value.clone() : detail::gather_tensor_parallel_split(value, split->second));
  }
  return dict;
}

}  // namespace cpprun
