// tensor_parallel_full_state_dict (cpprun/tensor_parallel.h): each tensor-parallel module says
// which of its parameters are split along which dimension; those are all-gathered, the rest copied.
#include <ATen/ATen.h>

#include <map>

#include "cpprun/tensor_parallel.h"
#include "tp/tp_collectives.h"

namespace cpprun {
namespace {

struct Split {
  int64_t dim;
  ProcessGroup group;
};

// The split parameters of one module, by their name in it.
std::map<std::string, Split> splits_of(torch::nn::Module& module) {
  if (auto* c = dynamic_cast<ColwiseParallelLinearImpl*>(&module)) {
    return {{"weight", {0, c->process_group()}}, {"bias", {0, c->process_group()}}};
  }
  if (auto* r = dynamic_cast<RowwiseParallelLinearImpl*>(&module)) return {{"weight", {1, r->process_group()}}};
  if (auto* e = dynamic_cast<VocabParallelEmbeddingImpl*>(&module)) return {{"weight", {0, e->process_group()}}};
  return {};  // SequenceParallelLayerNorm and plain modules: whole on every rank
}

}  // namespace

torch::OrderedDict<std::string, at::Tensor> tensor_parallel_full_state_dict(torch::nn::Module& module) {
  std::map<std::string, Split> splits;
  auto note = [&](const std::string& prefix, torch::nn::Module& m) {
    for (auto& [name, split] : splits_of(m)) splits.emplace(prefix + name, split);
  };
  note("", module);
  for (const auto& item : module.named_modules(std::string(), /*include_self=*/false)) {
    note(item.key() + ".", *item.value());
  }
  torch::OrderedDict<std::string, at::Tensor> dict;
  at::NoGradGuard no_grad;
  for (const auto& item : module.named_parameters()) {
    auto split = splits.find(item.key());
    dict.insert(item.key(), split == splits.end()
                                ? item.value().detach().clone()
                                : tp::all_gather_along(item.value().detach(), split->second.group, split->second.dim,
                                                       "tensor_parallel_full_state_dict"));
  }
  for (const auto& item : module.named_buffers()) dict.insert(item.key(), item.value().detach().clone());
  return dict;
}

}  // namespace cpprun
