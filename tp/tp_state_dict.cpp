// tensor_parallel_full_state_dict (cpprun/tensor_parallel.h): each tensor-parallel module says
// which of its parameters are split along which dimension (cpprun/tensor_parallel_split.h); those
// are all-gathered, the rest copied.
#include <ATen/ATen.h>

#include <vector>

#include "cpprun/tensor_parallel.h"
#include "tp/tp_collectives.h"

namespace cpprun {
namespace {

// The whole tensor of which `shard` is this rank's part.
at::Tensor gather_split(const at::Tensor& shard, const TensorParallelSplit& split) {
  at::Tensor gathered = tp::all_gather_along(shard, split.group, split.dim, "tensor_parallel_full_state_dict");
  if (split.parts == 1) return gathered;
  // Rank r's shard is [chunk r of block 0, chunk r of block 1, ...]: gathered, the pieces are in
  // order (rank, block); the whole tensor wants (block, rank).
  const int64_t ranks = split.group.size();
  const auto pieces = gathered.chunk(ranks * split.parts, split.dim);
  std::vector<at::Tensor> in_order;
  for (int64_t block = 0; block < split.parts; ++block) {
    for (int64_t r = 0; r < ranks; ++r) in_order.push_back(pieces[r * split.parts + block]);
  }
  return at::cat(in_order, split.dim);
}

}  // namespace

torch::OrderedDict<std::string, at::Tensor> tensor_parallel_full_state_dict(torch::nn::Module& module) {
  const auto splits = tensor_parallel_splits(module);
  torch::OrderedDict<std::string, at::Tensor> dict;
  at::NoGradGuard no_grad;
  for (const auto& item : module.named_parameters()) {
    auto split = splits.find(item.key());
    dict.insert(item.key(), split == splits.end() ? item.value().detach().clone()
                                                  : gather_split(item.value().detach(), split->second));
  }
  for (const auto& item : module.named_buffers()) dict.insert(item.key(), item.value().detach().clone());
  return dict;
}

}  // namespace cpprun
