// See tensor_parallel_state.h.
#include "core/tensor_parallel_state.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <vector>

#include "cpprun/collectives.h"

namespace cpprun::detail {
at::Tensor gather_tensor_parallel_split(const at::Tensor& shard, const TensorParallelSplit& split) {
  const int64_t ranks = split.group.size();
  const int64_t dim = split.dim < 0 ? split.dim + shard.dim() : split.dim;
  TORCH_CHECK(dim >= 0 && dim < shard.dim() && shard.size(dim) % split.parts == 0, "cpprun: a tensor-parallel "
              "split says dim ", split.dim, " in ", split.parts, " parts, which a shard of shape ", shard.sizes(),
              " does not have.");
  auto gathered = at::empty({ranks * shard.numel()}, shard.options());
  all_gather_into(split.group, gathered, shard.detach().contiguous().view(-1));
  // Rank r's shard is [chunk r of block 0, chunk r of block 1, ...]; the whole tensor wants the
  // blocks in order, and within each the ranks' chunks in rank order.
  const auto shards = gathered.chunk(ranks);
  std::vector<at::Tensor> in_order;
  for (int64_t block = 0; block < split.parts; ++block) {
    for (int64_t r = 0; r < ranks; ++r) {
      in_order.push_back(shards[r].view(shard.sizes()).chunk(split.parts, dim)[block]);
    }
  }
  return at::cat(in_order, dim);
}

at::Tensor tensor_parallel_shard(const at::Tensor& whole, const TensorParallelSplit& split) {
  const int64_t ranks = split.group.size();
  const int64_t dim = split.dim < 0 ? split.dim + whole.dim() : split.dim;
  TORCH_CHECK(dim >= 0 && dim < whole.dim() && whole.size(dim) % (ranks * split.parts) == 0, "cpprun: a tensor of "
              "shape ", whole.sizes(), " cannot be split along dim ", split.dim, " into ", split.parts, " parts of ",
              ranks, " ranks each.");
  std::vector<at::Tensor> mine;
  for (const auto& block : whole.chunk(split.parts, dim)) mine.push_back(block.chunk(ranks, dim)[split.group.rank()]);
  return at::cat(mine, dim);
}

}  // namespace cpprun::detail
