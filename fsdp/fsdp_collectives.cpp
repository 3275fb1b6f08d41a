// See fsdp_collectives.h.
#include "fsdp/fsdp_collectives.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>

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
// A .grad that already is `value` keeps it, rather than doubling (GradientSync never hands a
// shard its own gradient again: stage 1 skips a second reduction with no backward between).
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

void write_rank_chunk(const ParamBucket& bucket, const at::Tensor& chunk, const at::Tensor& unsharded_like) {
  at::NoGradGuard no_grad;
  for (std::size_t i = 0; i < bucket.params().size(); ++i) {
    const ShardedParam& s = bucket.params()[i];
    bucket.region(unsharded_like, i)
        .narrow(0, bucket.rank() * s.chunk_numel(), s.chunk_numel())
        .copy_(chunk.narrow(0, s.wire_offset, s.chunk_numel()));
  }
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

// Note [Gradient divide factor]
// FSDP2 (_fsdp_collectives.py, _get_gradient_divide_factors and foreach_reduce) averages in fp32
// and bf16 with the collective's own AVG; with set_gradient_divide_factor(f) it reduce-scatters
// with AVG where f is the shard group's size, else with NCCL's PREMUL_SUM(1/f) (each input times
// 1/f, then summed), and all-reduces across HSDP's replicas with SUM: the sum of every rank's
// gradient over f. In other dtypes (float16 and float64: "overflow risk"), or with
// set_force_sum_reduction_for_comms(true), both collectives SUM, around two divisions that
// multiply to f (default: the data-parallel size): in those dtypes by `pre`, a power of two near
// sqrt(f) (float16's range: neither the sum nor the quotients overflow), before the reduction
// and by f / pre after it; in fp32 and bf16 by f after it. Here the same steps in the same
// dtypes give the same bits (ours AVG sums and divides, Gloo's does the same). Where the shard
// group is one rank FSDP2 skips the reduce-scatter and divides its input by f itself, after its
// `pre` division: in float16 and float64, and with force_sum, it so divides by f twice (2.15:
// fully_shard on a 2 x 1 mesh, factor 3, float64 gives 2/9 of the sum); cpprun divides once.
GradientDivision gradient_division(int shard_size, int replicate_size, at::ScalarType reduce_dtype,
                                   std::optional<double> factor, bool force_sum) {
  GradientDivision d;
  const bool overflow_risk = reduce_dtype != at::kFloat && reduce_dtype != at::kBFloat16;
  const int data_parallel = shard_size * replicate_size;
  if (!overflow_risk && !force_sum) {
    if (!factor) {
      d.shard_op = d.replicate_op = data_parallel == 1 ? ReduceOp::kSum : ReduceOp::kAvg;
      return d;
    }
    d.replicate_op = ReduceOp::kSum;
    if (shard_size == 1) {
      d.shard_op = ReduceOp::kSum;  // nothing to reduce: FSDP2 divides the input by the factor
      if (*factor != 1) d.divide_before = *factor;
    } else if (*factor == shard_size) {
      d.shard_op = ReduceOp::kAvg;
    } else {
      d.shard_op = ReduceOp::kSum;
      d.multiply_before = 1 / *factor;
    }
    return d;
  }
  const double f = factor.value_or(static_cast<double>(data_parallel));
  d.shard_op = d.replicate_op = ReduceOp::kSum;
  double pre = 1;
  if (overflow_risk) {
    while (std::fmod(f, pre) == 0 && f / pre > pre) pre *= 2;
  }
  const double post = f / pre;
  if (pre != 1) d.divide_before = pre;
  if (post != 1) d.divide_after = post;
  return d;
}

at::Tensor scaled_before_reduction(const GradientDivision& division, at::Tensor grad, at::ScalarType reduce_dtype) {
  if (!grad.defined() || (!division.divide_before && !division.multiply_before)) return grad;
  at::NoGradGuard no_grad;
  if (grad.scalar_type() != reduce_dtype) grad = grad.to(reduce_dtype);
  if (division.divide_before) grad.div_(*division.divide_before);
  if (division.multiply_before) grad.mul_(*division.multiply_before);
  return grad;
}

void scale_after_reduction(const GradientDivision& division, const at::Tensor& reduced) {
  at::NoGradGuard no_grad;
  if (division.divide_after) reduced.div_(*division.divide_after);
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
  return all_gather_shards(group, {{&bucket, into}});
}

Work all_gather_shards(const ProcessGroup& group,
                       const std::vector<std::pair<const ParamBucket*, at::Tensor>>& buckets_into) {
  TORCH_INTERNAL_ASSERT(!buckets_into.empty());
  const at::TensorOptions wire = buckets_into.front().second.options();
  // Alone, the copies are all there is (none, where the shards are views of `into`).
  for (const auto& [bucket, into] : buckets_into) copy_shards_into(*bucket, into);
  if (group.size() == 1) return Work();
  // The buckets' wire chunks end to end: bucket k's rows of rank q are the collective's chunk q
  // from the sum of the earlier buckets' chunk_numel on.
  ChunkedTensor places;
  places.chunks.resize(group.size());
  std::vector<std::pair<int64_t, int64_t>> extents;
  for (const auto& [bucket, into] : buckets_into) {
    TORCH_INTERNAL_ASSERT(into.scalar_type() == wire.dtype().toScalarType() && into.device() == wire.device());
    TORCH_INTERNAL_ASSERT(bucket->world() == group.size());
    ChunkedTensor one = unsharded_chunks(*bucket, into);
    for (int q = 0; q < group.size(); ++q) {
      for (ChunkPiece& piece : one.chunks[q]) {
        piece.offset += places.chunk_numel;
        places.chunks[q].push_back(std::move(piece));
      }
    }
    for (const ShardedParam& s : bucket->params()) extents.emplace_back(places.chunk_numel + s.wire_offset, s.chunk_numel());
    places.chunk_numel += bucket->chunk_numel();
  }
  places.message_starts = message_starts_for(extents, static_cast<int64_t>(wire.dtype().itemsize()));
  return all_gather_chunks_in_place_async(group, std::move(places), wire);
}

namespace {

// The bucket's gradients, as `pieces` places them, reduced into `chunk`; partials wait in the
// gradients themselves (see the header).
Work reduce_scatter_gradient_pieces(const ProcessGroup& group, const ParamBucket& bucket, const at::Tensor& chunk,
                                    ChunkedTensor pieces, ReduceOp op) {
  pieces.pieces_are_scratch = true;
  pieces.message_starts = wire_message_starts(bucket, static_cast<int64_t>(chunk.element_size()));
  return reduce_scatter_chunks_async(group, chunk, std::move(pieces), op);
}

}  // namespace

Work reduce_scatter_gradients(const ProcessGroup& group, const ParamBucket& bucket, const at::Tensor& chunk,
                              const std::vector<at::Tensor>& grads, ReduceOp op) {
  return reduce_scatter_gradient_pieces(group, bucket, chunk, gradient_chunks(bucket, grads), op);
}

Work reduce_scatter_unsharded_gradient(const ProcessGroup& group, const ParamBucket& bucket, const at::Tensor& chunk,
                                       const at::Tensor& unsharded_grad, ReduceOp op) {
  return reduce_scatter_gradient_pieces(group, bucket, chunk, unsharded_chunks(bucket, unsharded_grad), op);
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
                           std::optional<at::ScalarType> reduce_dtype, const GradientDivision& division) {
  TORCH_INTERNAL_ASSERT(bucket.world() == 1 && grads.size() == bucket.params().size());
  at::NoGradGuard no_grad;
  for (std::size_t i = 0; i < grads.size(); ++i) {
    const ShardedParam& s = bucket.params()[i];
    if (!grads[i].defined() && s.shard.grad().defined()) continue;  // adding zeros
    at::Tensor grad = grads[i].defined() ? grads[i].contiguous() : at::zeros_like(s.shard);
    if (reduce_dtype && grad.scalar_type() != *reduce_dtype) grad = grad.to(*reduce_dtype);
    grad = scaled_before_reduction(division, grad, grad.scalar_type());
    scale_after_reduction(division, grad);
    // Shaped as the shard (a 0-d parameter's is [1]) and never a view: zero_grad() detach_()es
    // every .grad, which views refuse (core/tensor_alias.h).
    if (grad.is_view() || grad.sizes() != at::IntArrayRef(s.shard_sizes())) grad = alias_into(grad, 0, s.shard_sizes());
    accumulate_grad(s.shard, grad);
  }
}

// Note [Shard writes seen on one rank]
// Whether a kept gathered unit (ZeRO-3) or bucket (ZeRO-1/2) must be gathered again after a
// user's in-place write to the shards is read from the shards' version counters, and those are
// each rank's own: a write on some ranks only (a loop that skips a rank's empty shard, a write
// under `if (rank == 0)`) would have those ranks all-gather and the others not, and the next
// collectives would pair wrongly (a hang, or the mismatch check's error). So the verdict is
// agreed over the shard group before anyone acts on it: what changed on any rank is gathered
// again on every rank. The call comes only where versions decide, i.e. when something is kept
// gathered and nothing else (a step, a load) already forces the gather: a training loop's
// forward after a synchronized backward makes no such call, but at stages 1 and 2 with frozen
// parameters (which a step does not change, so versions decide) one; a forward after a no_sync
// backward with kept units, or an evaluation forward between steps, makes one. Each is one small
// CPU all-reduce of a flag per bucket (FSDP2 all-gathers every frozen parameter each step instead).
std::vector<bool> changed_on_any_rank(const ProcessGroup& group, const std::vector<bool>& changed_here) {
  if (group.size() <= 1 || changed_here.empty()) return changed_here;
  at::Tensor flags = at::zeros({static_cast<int64_t>(changed_here.size())}, at::kInt);
  auto f = flags.accessor<int32_t, 1>();
  for (std::size_t i = 0; i < changed_here.size(); ++i) f[static_cast<int64_t>(i)] = changed_here[i] ? 1 : 0;
  all_reduce(group, flags, ReduceOp::kMax);
  std::vector<bool> changed(changed_here.size());
  for (std::size_t i = 0; i < changed.size(); ++i) changed[i] = f[static_cast<int64_t>(i)] != 0;
  return changed;
}

}  // namespace cpprun::detail
