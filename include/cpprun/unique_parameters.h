// Tied parameters: one tensor registered under two names, e.g. a language model's output layer
// reusing the token embedding:
//
//   struct TiedHead : torch::nn::Module {
//     torch::Tensor weight;
//     explicit TiedHead(torch::Tensor embedding) { weight = register_parameter("weight", embedding); }
//     torch::Tensor forward(torch::Tensor x) { return torch::matmul(x, weight.t()); }
//   };
//
// Autograd sums both uses' gradients into the one tensor. DistributedDataParallel reduces it once;
// FullyShardedDataParallel keeps it once, in the first unit that holds it, and its other unit
// gathers that one when it uses the tensor (ZeRO-3). But LibTorch's Module::parameters() lists it
// once per name (unlike Python's, which skips repeats), and an optimizer given it twice steps it
// twice: build the optimizer from unique_parameters(*model) instead. FSDP's model->parameters()
// list each shard once, under its first name (as Python's named_parameters() does).
#pragma once

#include <torch/nn/module.h>

#include <torch/ordered_dict.h>

#include <string>
#include <unordered_set>
#include <vector>

namespace cpprun {

// module.parameters() with each tensor once, in the order of its first name.
inline std::vector<at::Tensor> unique_parameters(const torch::nn::Module& module) {
  std::vector<at::Tensor> unique;
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const auto& p : module.parameters()) {
    if (seen.insert(p.unsafeGetTensorImpl()).second) unique.push_back(p);
  }
  return unique;
}

// module.named_parameters() with each tensor once, under its first name, as Python's
// named_parameters() (remove_duplicate=True): what optimizer parameter groups are built from.
inline torch::OrderedDict<std::string, at::Tensor> unique_named_parameters(const torch::nn::Module& module) {
  torch::OrderedDict<std::string, at::Tensor> unique;
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const auto& item : module.named_parameters()) {
    if (seen.insert(item.value().unsafeGetTensorImpl()).second) unique.insert(item.key(), item.value());
  }
  return unique;
}

}  // namespace cpprun
