// FSDP's wire work for one bucket (param_bucket.h): one all-gather of parameters and one
// reduce-scatter of gradients, each rank's chunk read from or written to the
// parameters' own places (comm/chunked_collectives.h), and the shard gradients handed to the
// optimizer. Stateless: it takes tensors and groups and returns handles; when to call it is the
// schedulers' business (gradient_sync.h, parameter_residency.h), as FSDP2 keeps
// _fsdp_collectives apart from _fsdp_param_group.
//
// Note [Unsharded and wire layouts]
// A bucket of parameters p_i with C_i rows per rank and n_i elements per row has two layouts:
//   unsharded: p_0's W*C_0 rows, p_1's W*C_1 rows, ...   (each parameter contiguous: the module's)
//   wire:      chunk 0 | chunk 1 | ... | chunk W-1, chunk q = p_0's rows [q*C_0, q*C_0 + C_0),
//              p_1's rows [q*C_1, ...), ...               (each rank's part contiguous: the wire's)
// The wire is never made whole: the ring collectives move one chunk at a time, as a message per
// parameter (small ones grouped), each sent from or received into the parameter's rows (or its
// gradient's) where it lies. FSDP2 copies the whole bucket into and out of a flat buffer around
// the collective instead: twice the memory for a moment, and two copies of every byte. A rank's
// shard of p_i is contiguous in both layouts.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <vector>

#include "comm/ring.h"
#include "cpprun/collectives.h"
#include "fsdp/param_bucket.h"

namespace cpprun::detail {

// This rank's shards end to end (its wire chunk), zero-padded, as `options` says (the compute
// dtype and the model's device: the cast and the offloaded shards' copy happen here).
at::Tensor shard_chunk(const ParamBucket& bucket, const at::TensorOptions& options);
// This rank's rows of every parameter of a tensor laid out like unsharded() (e.g. a gradient).
at::Tensor rank_chunk(const ParamBucket& bucket, const at::Tensor& unsharded_like);
// The reverse: `chunk` (this rank's wire chunk, padding included) into this rank's rows of
// `unsharded_like`, cast to its dtype.
void write_rank_chunk(const ParamBucket& bucket, const at::Tensor& chunk, const at::Tensor& unsharded_like);

// Where each rank's wire chunk lives in a tensor laid out like unsharded(): every parameter's
// rows [q*C, q*C + C), padding rows included.
ChunkedTensor unsharded_chunks(const ParamBucket& bucket, const at::Tensor& unsharded_like);
// Where each rank's wire chunk lives in the parameters' full gradients (`grads[i]` shaped as
// parameter i, or undefined for none): the real rows only, so padding rows count as zeros.
ChunkedTensor gradient_chunks(const ParamBucket& bucket, const std::vector<at::Tensor>& grads);

// This rank's shards into its own rows of `into` (laid out like unsharded(); padding zeroed).
void copy_shards_into(const ParamBucket& bucket, const at::Tensor& into);
// All-gathers the bucket's shards into `into` (laid out like unsharded(), in its dtype): this
// rank's copied into its rows, every other rank's received straight into each parameter's rows.
// In a group of one, only the copy (none where the shards are views of `into`).
Work all_gather_shards(const ProcessGroup& group, const ParamBucket& bucket, const at::Tensor& into);
// The same for several buckets as one collective, each (bucket, into) as above; every `into` of
// one dtype and device, the collective's. A unit's trainable and frozen buckets of one dtype (a
// LoRA block's) so cost one all-gather, as FSDP2 gathers a parameter group's parameters,
// whatever their requires_grad, in one. Every rank gives the same buckets in the same order.
Work all_gather_shards(const ProcessGroup& group,
                       const std::vector<std::pair<const ParamBucket*, at::Tensor>>& buckets_into);
// `changed_here[i]` ORed over the group's ranks (one small all-reduce of CPU integers, Gloo's
// even in an NCCL job: no device sync), where the group has more than one rank and the list is
// not empty; else `changed_here`. Collective: every rank of the group calls it with a list of the
// same length. See Note [Shard writes seen on one rank] in fsdp_collectives.cpp.
std::vector<bool> changed_on_any_rank(const ProcessGroup& group, const std::vector<bool>& changed_here);
// How a reduction scales the gradients' sum: FSDP2's _get_gradient_divide_factors
// (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py), step for step, so that the bits match
// (Note [Gradient divide factor] in fsdp_collectives.cpp). Each rank's gradient (in the reduce
// dtype) is divided by `divide_before` or multiplied by `multiply_before`, reduced over the shard
// group with `shard_op`, HSDP's replicas all-reduce it with `replicate_op`, and the result is
// divided by `divide_after`.
struct GradientDivision {
  std::optional<double> divide_before;
  std::optional<double> multiply_before;  // NCCL's PREMUL_SUM(1 / factor), by hand
  ReduceOp shard_op = ReduceOp::kAvg;
  ReduceOp replicate_op = ReduceOp::kAvg;
  std::optional<double> divide_after;
};
// `factor`: set_gradient_divide_factor's (none: the data-parallel size, shard_size x
// replicate_size); `force_sum`: set_force_sum_reduction_for_comms's.
GradientDivision gradient_division(int shard_size, int replicate_size, at::ScalarType reduce_dtype,
                                   std::optional<double> factor, bool force_sum);
// `grad` with divide_before / multiply_before applied, in `reduce_dtype` (cast first where it is
// another; in place where not). Undefined stays undefined.
at::Tensor scaled_before_reduction(const GradientDivision& division, at::Tensor grad, at::ScalarType reduce_dtype);
// divide_after applied to `reduced`, in place.
void scale_after_reduction(const GradientDivision& division, const at::Tensor& reduced);

// Reduces the parameters' full gradients over the group with `op` into this rank's `chunk` (in
// chunk's dtype), read straight from `grads` (as gradient_chunks()). The gradients are the ring's
// scratch: other ranks' partial sums wait in them between steps, so their values afterwards are
// not the gradients (GradientSync drops them once this is done). Nothing may touch them until
// the returned work is done.
Work reduce_scatter_gradients(const ProcessGroup& group, const ParamBucket& bucket, const at::Tensor& chunk,
                              const std::vector<at::Tensor>& grads, ReduceOp op);

// The same from a gradient laid out like unsharded() (stage 1's full gradient, kept between
// steps): this rank's rows of every rank's copy, reduced into `chunk`. Its rows are the ring's
// scratch as above: afterwards only this rank's rows of it are the gradient (GradientSync
// writes the reduced chunk back there), and nothing may touch it until the work is done.
Work reduce_scatter_unsharded_gradient(const ProcessGroup& group, const ParamBucket& bucket, const at::Tensor& chunk,
                                       const at::Tensor& unsharded_grad, ReduceOp op);

// Every shard's .grad from this rank's chunk of reduced gradients, added into a .grad the shard
// has (Note [Shard gradients accumulate]); else a view of the chunk where dtype and device match
// the shard's, or a copy (mixed precision's master shards, CPU offload).
void accumulate_shard_grads_from_chunk(ParamBucket& bucket, const at::Tensor& chunk);
// The same from a gradient laid out like unsharded() (stage 1's, this rank's rows reduced).
void accumulate_shard_grads_from_unsharded(ParamBucket& bucket, const at::Tensor& unsharded_grad);
// A group of one rank: every shard is its whole parameter, and its .grad the parameter's own
// gradient `grads[i]` (zeros where it got none), rounded to `reduce_dtype` when given, as a
// reduction in it would, then to the shard's dtype: no copy where the types match. Added into a
// .grad the shard has, as above. `division` scales it as a reduction would (a divide factor).
void accumulate_shard_grads_alone(ParamBucket& bucket, const std::vector<at::Tensor>& grads,
                           std::optional<at::ScalarType> reduce_dtype, const GradientDivision& division);

}  // namespace cpprun::detail
