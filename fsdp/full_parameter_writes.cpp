// See full_parameter_writes.h.
#include "fsdp/full_parameter_writes.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "fsdp/full_gradient_guard.h"

namespace cpprun::detail {

// Note [In-place writes to full parameters]
// The wrapped module keeps its full parameters (what its forward computes with); the optimizer
// steps the shards, and every gather rebuilds the full parameters from them. A user who writes a
// full parameter in place after wrapping (torchtitan's init_weights after fully_shard, ported:
// `for (auto& p : net->parameters()) p.normal_(0, 0.02)` under no_grad, `.fill_`, `.copy_` from a
// reference, `.data().uniform_()`) means the model to train from the written values, as FSDP2's
// in-place init on net.parameters() (DTensor shards) writes the sharded parameters. So the write
// must reach this rank's shard: each rank copies its own rows of the full tensor it wrote into
// its shard (every rank must write the same values, e.g. from a generator seeded alike, as the
// wrapper's own broadcast from rank 0 made them equal). Per stage:
//  - ZeRO-1/2 in the parameters' dtype: the shards are views of the full parameters' rows, so the
//    write reaches them by itself; nothing to do.
//  - ZeRO-3: the full parameters carry the gather-on-use key (gather_on_use.h) and their views,
//    .data() included, carry it too. Its fallback sees each operator's schema, whose alias
//    annotation `Tensor(a!)` marks the arguments written in place: it gathers the unit (a released
//    unit's memory holds nothing to write into), runs the write, then copies this rank's rows of
//    each parameter the written tensor covers into its shard (write_back_rows). The unit stays
//    gathered and current. Before, the write went to the gathered copy only and the next gather
//    overwrote it: silently lost.
//  - Mixed precision (param_dtype): the full parameter is a bf16 copy of the fp32 shard; carrying
//    a write back would round the user's values (three significant digits for normal_) and train
//    from something else than what was written, where FSDP2 writes fp32 shards exactly. Refused,
//    naming the parameter: write the shards (model->parameters(), the fp32 masters) or initialise
//    before wrapping. At ZeRO-3 on the write itself (the fallback, before anything is gathered);
//    at ZeRO-1/2, where no key watches the compute copies (a fallback on every forward and backward
//    operator would cost them all), their version counters at the next forward, gather or
//    checkpoint (ComputeCopyVersions), where the write would otherwise be overwritten or ignored.
//    A write through .data() shares no version counter, so there it goes unseen (docs/fsdp.md).
// A write cannot tell a user from an optimizer built over the full parameters, which the first
// read of a gradient refuses (full_gradient_guard.h): AdamW's weight decay before that read reaches
// the first parameter's shard, as it always did at ZeRO-1/2; under mixed precision the refusal
// comes first and names both causes.
// The cost on the hot path: operators on watched tensors already pay the fallback's registry look-up;
// the schema's argument is read only for a tensor found watched (a pointer test for one without
// alias annotation), and nothing more runs unless it is written in place. ZeRO-1/2 read one
// version counter per parameter per forward (the shards', to gather again after a user wrote them),
// two under mixed precision.

std::vector<std::size_t> params_written(const ParamBucket& bucket, const at::Tensor& written) {
  std::vector<std::size_t> out;
  if (written.numel() == 0) return out;
  const auto& params = bucket.params();
  // The elements the write may touch, [first, last], in unsharded()'s elements.
  int64_t first = 0, last = bucket.unsharded_numel() - 1;
  bool exact = written.element_size() == bucket.unsharded().element_size();
  if (exact) {
    first = last = written.storage_offset();
    for (int64_t d = 0; d < written.dim(); ++d) {
      const int64_t reach = (written.size(d) - 1) * written.stride(d);
      if (reach < 0) exact = false;
      last += reach;
    }
  }
  if (!exact) first = 0, last = bucket.unsharded_numel() - 1;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const int64_t begin = params[i].unsharded_offset, end = begin + params[i].rows * params[i].row_numel;
    if (begin <= last && first < end) out.push_back(i);
  }
  return out;
}

void refuse_write_to_compute_copy(const ParamBucket& bucket, std::size_t i, const std::string& what, int rank) {
  const ShardedParam& p = bucket.params()[i];
  // Between a synchronized backward and the next forward an optimizer over the full parameters
  // writes one (weight decay) before it reads the gradient that would refuse it (Note [Full
  // gradients after a synchronized backward] in full_gradient_guard.cpp): say so too.
  const bool optimizer_may = is_full_gradient_guard(p.param.unsafeGetTensorImpl()->grad());
  TORCH_CHECK(false, "cpprun::FullyShardedDataParallel: ", what, " wrote the wrapped module's parameter \"", p.name,
              "\" in place after wrapping (rank ", rank, "). ",
              optimizer_may ? "If an optimizer built over the wrapped module's own parameters (net->parameters() "
                              "after wrapping, or before it) made this write, build it from model->parameters() "
                              "instead; its step reads the gradients there. Otherwise: under"
                            : "Under",
              " mixed precision that parameter is the ", bucket.unsharded().scalar_type(),
              " compute copy (param_dtype) of the ", p.shard.scalar_type(),
              bucket.frozen() ? " shards FSDP keeps of it (frozen: the master values), and every "
                              : " shards the optimizer steps, and every ",
              "gather rebuilds it from them: the write would be lost, and carrying it back would round the values "
              "written. Initialise the module before wrapping it (the wrapper shards what it holds), or write the "
              "shards: model->named_parameters() holds \"", p.name, "\" as this rank's rows of it, rows [r*C, r*C + C) "
              "on rank r with C = ceil(", p.rows, " / world) (write each rank's rows of the same full tensor). See "
              "docs/fsdp.md, \"In-place writes after wrapping\".");
}

void write_back_rows(ParamBucket& bucket, std::size_t i) {
  ShardedParam& p = bucket.params()[i];
  if (p.local_rows == 0) return;
  TORCH_INTERNAL_ASSERT(bucket.unsharded_allocated(), "write-back from a released unit");
  at::NoGradGuard no_grad;
  p.shard.copy_(bucket.shard_view(bucket.unsharded(), i));
}

ComputeCopyVersions::ComputeCopyVersions(const std::vector<ParamBucket>& buckets) {
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    if (!buckets[b].shards_are_separate()) continue;
    for (std::size_t i = 0; i < buckets[b].params().size(); ++i) {
      recorded_.push_back({b, i, static_cast<int64_t>(buckets[b].params()[i].param._version())});
    }
  }
}

void ComputeCopyVersions::refuse_writes(const std::vector<ParamBucket>& buckets, int rank) const {
  for (const Recorded& r : recorded_) {
    const ShardedParam& p = buckets[r.bucket].params()[r.param];
    if (static_cast<int64_t>(p.param._version()) == r.version) continue;
    refuse_write_to_compute_copy(buckets[r.bucket], r.param, "an in-place operator (seen at this forward, gather or "
                                 "checkpoint by the parameter's version counter)", rank);
  }
}

}  // namespace cpprun::detail
