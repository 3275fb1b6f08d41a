// See fsdp_collectives.h.
#include "fsdp/fsdp_collectives.h"

#include <ATen/ATen.h>

#include "core/tensor_alias.h"

namespace cpprun::detail {
namespace {

void assign_grad(const at::Tensor& shard, const at::Tensor& value) {
  at::Tensor& grad = shard.mutable_grad();
  if (value.scalar_type() == shard.scalar_type() && value.device() == shard.device()) {
    grad = value;
  } else if (grad.defined() && grad.sizes() == shard.sizes() && !grad.is_same(value)) {
    grad.copy_(value);  // the copy kept from the last step
  } else {
    grad = value.to(shard.device(), shard.scalar_type(), /*non_blocking=*/false, /*copy=*/true);
  }
}

}  // namespace

at::Tensor shard_chunk(const ParamBucket& bucket, const at::TensorOptions& options) {
  at::NoGradGuard no_grad;
  at::Tensor chunk = at::empty({bucket.chunk_numel()}, options);
  for (const ShardedParam& s : bucket.params()) {
    at::Tensor place = chunk.narrow(0, s.wire_offset, s.chunk_numel());
    if (s.local_numel() > 0) place.narrow(0, 0, s.local_numel()).copy_(s.shard.detach().reshape({-1}), true);
    if (s.local_numel() < s.chunk_numel()) place.narrow(0, s.local_numel(), s.chunk_numel() - s.local_numel()).zero_();
  }
  return chunk;
}

at::Tensor rank_chunk(const ParamBucket& bucket, const at::Tensor& unsharded_like) {
  at::NoGradGuard no_grad;
  at::Tensor chunk = at::empty({bucket.chunk_numel()}, unsharded_like.options());
  for (std::size_t i = 0; i < bucket.params().size(); ++i) {
    const ShardedParam& s = bucket.params()[i];
    chunk.narrow(0, s.wire_offset, s.chunk_numel())
        .copy_(bucket.region(unsharded_like, i).narrow(0, bucket.rank() * s.chunk_numel(), s.chunk_numel()));
  }
  return chunk;
}

void copy_out_gathered(const ParamBucket& bucket, const at::Tensor& received, const at::Tensor& into) {
  at::NoGradGuard no_grad;
  const int64_t world = bucket.world();
  at::Tensor chunks = received.view({world, bucket.chunk_numel()});
  for (std::size_t i = 0; i < bucket.params().size(); ++i) {
    const ShardedParam& s = bucket.params()[i];
    if (s.chunk_numel() == 0) continue;
    bucket.region(into, i).view({world, s.chunk_numel()}).copy_(chunks.narrow(1, s.wire_offset, s.chunk_numel()));
  }
}

Work all_gather_shards(const ProcessGroup& group, const ParamBucket& bucket, const at::Tensor& into,
                       const at::Tensor& received) {
  at::Tensor send = shard_chunk(bucket, into.options());
  Work work = all_gather_into_async(group, received, send);
  return work.then([&bucket, into, received, send] { copy_out_gathered(bucket, received, into); });
}

void copy_gradient_to_wire(const ParamBucket& bucket, std::size_t i, const at::Tensor& grad, const at::Tensor& wire) {
  const ShardedParam& s = bucket.params()[i];
  if (s.chunk_numel() == 0) return;
  at::NoGradGuard no_grad;
  const int64_t rows_per_rank = s.rows_per_rank;
  at::Tensor places = wire.view({bucket.world(), bucket.chunk_numel()}).narrow(1, s.wire_offset, s.chunk_numel());
  at::Tensor rows = grad.reshape({s.rows, s.row_numel});
  const int64_t whole = s.rows / rows_per_rank;  // ranks whose rows are all real
  if (whole > 0) places.narrow(0, 0, whole).copy_(rows.narrow(0, 0, whole * rows_per_rank).reshape({whole, -1}));
  const int64_t rest = s.rows - whole * rows_per_rank;
  if (rest > 0) places.select(0, whole).narrow(0, 0, rest * s.row_numel).copy_(rows.narrow(0, whole * rows_per_rank, rest).reshape({-1}));
}

Work reduce_scatter_gradients(const ProcessGroup& group, const at::Tensor& chunk, const at::Tensor& wire) {
  return reduce_scatter_async(group, chunk, wire, ReduceOp::kAvg);
}

void set_shard_grads_from_chunk(ParamBucket& bucket, const at::Tensor& chunk) {
  at::NoGradGuard no_grad;
  for (const ShardedParam& s : bucket.params()) assign_grad(s.shard, alias_into(chunk, s.wire_offset, s.shard_sizes()));
}

void set_shard_grads_from_unsharded(ParamBucket& bucket, const at::Tensor& unsharded_grad) {
  at::NoGradGuard no_grad;
  for (std::size_t i = 0; i < bucket.params().size(); ++i) {
    assign_grad(bucket.params()[i].shard, bucket.shard_view(unsharded_grad, i));
  }
}

}  // namespace cpprun::detail
