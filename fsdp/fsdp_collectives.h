// FSDP's wire work for one bucket (param_bucket.h): the copy-in to and copy-out from the wire
// layout around one all-gather of parameters and one reduce-scatter (or all-reduce) of
// gradients, and the shard gradients handed to the optimizer. Stateless: it takes tensors and
// groups and returns handles; when to call it is the schedulers' business (gradient_sync.h,
// parameter_residency.h), as FSDP2 keeps _fsdp_collectives apart from _fsdp_param_group.
//
// Note [Unsharded and wire layouts]
// A bucket of parameters p_i with C_i rows per rank and n_i elements per row has two layouts:
//   unsharded: p_0's W*C_0 rows, p_1's W*C_1 rows, ...   (each parameter contiguous: the module's)
//   wire:      chunk 0 | chunk 1 | ... | chunk W-1, chunk q = p_0's rows [q*C_0, q*C_0 + C_0),
//              p_1's rows [q*C_1, ...), ...               (each rank's part contiguous: the wire's)
// An all-gather of the chunks gives the wire layout; one strided copy per parameter turns it
// into the unsharded one (and back for gradients). A rank's shard of p_i is contiguous in both.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

#include "cpprun/collectives.h"
#include "fsdp/param_bucket.h"

namespace cpprun::detail {

// This rank's shards end to end (its wire chunk), zero-padded, as `options` says (the compute
// dtype and the model's device: the cast and the offloaded shards' copy happen here).
at::Tensor shard_chunk(const ParamBucket& bucket, const at::TensorOptions& options);
// This rank's rows of every parameter of a tensor laid out like unsharded() (e.g. a gradient).
at::Tensor rank_chunk(const ParamBucket& bucket, const at::Tensor& unsharded_like);

// The all-gathered chunks (`received`, wire layout) into `into` (laid out like unsharded()).
void copy_out_gathered(const ParamBucket& bucket, const at::Tensor& received, const at::Tensor& into);
// All-gathers the bucket's shards into `into` (laid out like unsharded(), in its dtype) through
// `received` (unsharded_numel() elements of that dtype, e.g. reused memory): the copy-out runs
// when the returned work is waited for.
Work all_gather_shards(const ProcessGroup& group, const ParamBucket& bucket, const at::Tensor& into,
                       const at::Tensor& received);

// Parameter i's full gradient into its places in `wire` (laid out as the wire, zeros where
// nothing is written), cast to wire's dtype.
void copy_gradient_to_wire(const ParamBucket& bucket, std::size_t i, const at::Tensor& grad, const at::Tensor& wire);
// Averages `wire` over the group into this rank's `chunk`.
Work reduce_scatter_gradients(const ProcessGroup& group, const at::Tensor& chunk, const at::Tensor& wire);

// Every shard's .grad from this rank's chunk of reduced gradients: a view of it where dtype and
// device match the shard's, else a copy (mixed precision's master shards, CPU offload).
void set_shard_grads_from_chunk(ParamBucket& bucket, const at::Tensor& chunk);
// The same from a gradient laid out like unsharded() (stage 1's all-reduced one).
void set_shard_grads_from_unsharded(ParamBucket& bucket, const at::Tensor& unsharded_grad);

}  // namespace cpprun::detail
