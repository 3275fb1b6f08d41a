// See fsdp_collectives.h.
#include "fsdp/fsdp_collectives.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "comm/chunked_collectives.h"
#include "core/tensor_alias.h"

namespace cpprun::detail {
namespace {

// Note [Shard gradients accumulate]
// A shard with a .grad (the optimizer did not set it to none since the last reduction) gets the
// reduced gradient added in, as autograd's AccumulateGrad adds into any .grad and FSDP2's
// foreach_reduce into its sharded one: two synchronized backwards before one step sum their
// gradients. One without takes the value itself: a view of where the reduction left it where
// dtype and device match the shard's, else a copy (mixed precision's masters, CPU offload).
// GradientSync keeps a kept .grad out of the memory the next reduction writes.
// A .grad that already is `value` (stage 1 reducing twice with no backward between: the
// average of equal values) keeps it.
void accumulate_grad(const at::Tensor& shard, const at::Tensor& value) {
  at::Tensor& grad = shard.mutable_grad();
  if (grad.defined()) {
    if (grad.data_ptr() == value.data_ptr()) return;
    at::Tensor v = value;
    if (v.device() != grad.device() || at::result_type(grad, v) != grad.scalar_type()) {
      v = v.to(grad.device(), grad.scalar_type());
    }
    grad.add_(v);  // a lower-precision value is promoted as it is added
  } else if (value.scalar_type() == shard.scalar_type() && value.device() == shard.device()) {
    grad = value;
  } else {
    grad = value.to(shard.device(), shard.scalar_type(), /*non_blocking=*/false, /*copy=*/true);
  }
}

// How the bucket's chunks travel (comm/ring.h): a message per parameter of some size, the small
// ones grouped. From the layout alone, so every rank splits alike.
std::vector<int64_t> wire_message_starts(const ParamBucket& bucket, int64_t element_size) {
  std::vector<std::pair<int64_t, int64_t>> extents;
  for (const ShardedParam& s : bucket.params()) extents.emplace_back(s.wire_offset, s.chunk_numel());
  return message_starts_for(extents, element_size);
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

ChunkedTensor unsharded_chunks(const ParamBucket& bucket, const at::Tensor& unsharded_like) {
  ChunkedTensor chunked;
  chunked.chunk_numel = bucket.chunk_numel();
  chunked.chunks.resize(bucket.world());
  for (std::size_t i = 0; i < bucket.params().size(); ++i) {
    const ShardedParam& s = bucket.params()[i];
    if (s.chunk_numel() == 0) continue;
    at::Tensor rows = bucket.region(unsharded_like, i).view({bucket.world(), s.chunk_numel()});
    for (int q = 0; q < bucket.world(); ++q) chunked.chunks[q].push_back({s.wire_offset, rows[q]});
  }
  return chunked;
}

ChunkedTensor gradient_chunks(const ParamBucket& bucket, const std::vector<at::Tensor>& grads) {
  TORCH_INTERNAL_ASSERT(grads.size() == bucket.params().size());
  ChunkedTensor chunked;
  chunked.chunk_numel = bucket.chunk_numel();
  chunked.chunks.resize(bucket.world());
  for (std::size_t i = 0; i < grads.size(); ++i) {
    const ShardedParam& s = bucket.params()[i];
    if (!grads[i].defined() || s.chunk_numel() == 0) continue;
    at::Tensor rows = grads[i].contiguous().view({s.rows, s.row_numel});
    for (int q = 0; q < bucket.world(); ++q) {
      const int64_t first = std::min(q * s.rows_per_rank, s.rows);
      const int64_t count = std::min(s.rows_per_rank, s.rows - first);
      if (count > 0) chunked.chunks[q].push_back({s.wire_offset, rows.narrow(0, first, count)});
    }
  }
  return chunked;
}

void copy_shards_into(const ParamBucket& bucket, const at::Tensor& into) {
  at::NoGradGuard no_grad;
  for (std::size_t i = 0; i < bucket.params().size(); ++i) {
    const ShardedParam& s = bucket.params()[i];
    if (s.chunk_numel() == 0) continue;
    at::Tensor mine = bucket.region(into, i).view({bucket.world(), s.chunk_numel()})[bucket.rank()];
    if (s.local_numel() > 0) {
      at::Tensor place = mine.narrow(0, 0, s.local_numel());
      // Stages 1 and 2 keep each shard as a view of these very rows.
      if (place.data_ptr() != s.shard.data_ptr()) place.copy_(s.shard.detach().reshape({-1}), /*non_blocking=*/true);
    }
    if (s.local_numel() < s.chunk_numel()) mine.narrow(0, s.local_numel(), s.chunk_numel() - s.local_numel()).zero_();
  }
}

Work all_gather_shards(const ProcessGroup& group, const ParamBucket& bucket, const at::Tensor& into) {
  copy_shards_into(bucket, into);  // alone, all there is (nothing, where the shards are views of it)
  if (group.size() == 1) return Work();
  ChunkedTensor places = unsharded_chunks(bucket, into);
  places.message_starts = wire_message_starts(bucket, static_cast<int64_t>(into.element_size()));
  return all_gather_chunks_in_place_async(group, std::move(places), into.options());
}

Work reduce_scatter_gradients(const ProcessGroup& group, const ParamBucket& bucket, const at::Tensor& chunk,
                              const std::vector<at::Tensor>& grads) {
  ChunkedTensor pieces = gradient_chunks(bucket, grads);
  pieces.pieces_are_scratch = true;  // partials wait in the gradients themselves (see the header)
  pieces.message_starts = wire_message_starts(bucket, static_cast<int64_t>(chunk.element_size()));
  return reduce_scatter_chunks_async(group, chunk, std::move(pieces), ReduceOp::kAvg);
}

void accumulate_shard_grads_from_chunk(ParamBucket& bucket, const at::Tensor& chunk) {
  at::NoGradGuard no_grad;
  for (const ShardedParam& s : bucket.params()) accumulate_grad(s.shard, alias_into(chunk, s.wire_offset, s.shard_sizes()));
}

void accumulate_shard_grads_from_unsharded(ParamBucket& bucket, const at::Tensor& unsharded_grad) {
  at::NoGradGuard no_grad;
  for (std::size_t i = 0; i < bucket.params().size(); ++i) {
    accumulate_grad(bucket.params()[i].shard, bucket.shard_view(unsharded_grad, i));
  }
}

void accumulate_shard_grads_alone(ParamBucket& bucket, const std::vector<at::Tensor>& grads,
                           std::optional<at::ScalarType> reduce_dtype) {
  TORCH_INTERNAL_ASSERT(bucket.world() == 1 && grads.size() == bucket.params().size());
  at::NoGradGuard no_grad;
  for (std::size_t i = 0; i < grads.size(); ++i) {
    const ShardedParam& s = bucket.params()[i];
    if (!grads[i].defined() && s.shard.grad().defined()) continue;  // adding zeros
    at::Tensor grad = grads[i].defined() ? grads[i].contiguous() : at::zeros_like(s.shard);
    if (reduce_dtype && grad.scalar_type() != *reduce_dtype) grad = grad.to(*reduce_dtype);
    // Shaped as the shard (a 0-d parameter's is [1]) and never a view: zero_grad() detach_()es
    // every .grad, which views refuse (core/tensor_alias.h).
    if (grad.is_view() || grad.sizes() != at::IntArrayRef(s.shard_sizes())) grad = alias_into(grad, 0, s.shard_sizes());
    accumulate_grad(s.shard, grad);
  }
}

}  // namespace cpprun::detail
