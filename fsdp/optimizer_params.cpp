// See optimizer_params.h.
#include "fsdp/optimizer_params.h"

#include <ATen/ATen.h>

#include "cpprun/collectives.h"

namespace cpprun::detail {

OptimizerParams fsdp_optimizer_params(const std::vector<ParamBucket>& buckets, const ProcessGroup& shard_group) {
  OptimizerParams out;
  std::vector<const ShardedParam*> sharded;
  for (const ParamBucket& bucket : buckets) {
    for (const ShardedParam& s : bucket.params()) {
      out.names.push_back(s.name);
      out.stepped.push_back(s.shard);
      out.full_sizes.push_back(s.sizes);
      sharded.push_back(&s);
    }
  }
  const int world = shard_group.size();
  // Rank q's rows are [q*C, q*C + C) (fewer, or none, at the end): padded to C rows each, one
  // all-gather puts them end to end, and the first `rows` rows are the whole tensor.
  out.gather = [sharded, world, &shard_group](std::size_t i, const at::Tensor& local) {
    const ShardedParam& s = *sharded[i];
    at::Tensor chunk = at::zeros({s.chunk_numel()}, local.options());
    if (s.local_numel() > 0) chunk.narrow(0, 0, s.local_numel()).copy_(local.reshape({-1}));
    at::Tensor all = at::empty({s.chunk_numel() * world}, local.options());
    all_gather_into(shard_group, all, chunk);
    return all.narrow(0, 0, s.rows * s.row_numel).view(s.sizes);
  };
  out.local_part = [sharded](std::size_t i, const at::Tensor& whole) {
    const ShardedParam& s = *sharded[i];
    return whole.reshape({s.rows, s.row_numel}).narrow(0, s.first_row, s.local_rows).reshape(s.shard_sizes());
  };
  out.shard_group = &shard_group;
  return out;
}

}  // namespace cpprun::detail
