// One unit's parameters of one dtype, device and requires_grad, each sharded on dim 0 across the shard group
// (as FSDP2): parameter i of R rows keeps rows [r*C, r*C + local) on rank r, C = ceil(R / W),
// and the optimizer steps that shard under the parameter's own name. The rows past R on the last
// ranks are padding: zeros that never reach a shard.
//
// Two layouts of the bucket's elements (see Note [Unsharded and wire layouts]):
//  - unsharded(): the parameters end to end, each padded to W*C rows; the module's parameters
//    are views of it, so the module computes with them as before;
//  - the wire: rank q's chunk holds every parameter's rows [q*C, q*C + C) end to end, so that one
//    all-gather (of chunks) and one reduce-scatter (into chunks) move the whole bucket.
// fsdp_collectives.h copies between the two.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "fsdp/unit_plan.h"

namespace cpprun::detail {

// Where one parameter lives in its bucket.
struct ShardedParam {
  std::string name;          // under the wrapped module (its first name, if tied)
  at::Tensor param;          // the module's own tensor: a view of the bucket's unsharded()
  std::vector<int64_t> sizes;  // its full shape
  int64_t rows = 0;          // size(0) (a 0-d parameter counts as one row)
  int64_t row_numel = 0;     // elements per row
  int64_t rows_per_rank = 0; // C: ceil(rows / world)
  int64_t local_rows = 0;    // the rows this rank's shard holds (fewer than C, or none, at the end)
  int64_t first_row = 0;     // the first of them: min(rank * C, rows)
  int64_t unsharded_offset = 0;  // where its W*C padded rows start in unsharded()
  int64_t wire_offset = 0;       // where its C rows start within each rank's wire chunk
  at::Tensor shard;          // [local_rows, ...]: the leaf the optimizer steps

  int64_t chunk_numel() const { return rows_per_rank * row_numel; }
  int64_t local_numel() const { return local_rows * row_numel; }
  std::vector<int64_t> shard_sizes() const;
};

class ParamBucket {
 public:
  // `compute_dtype`: mixed precision (the module computes in it; shards stay in the parameters'
  // dtype). `separate_shards`: shards are copies rather than views of unsharded() (ZeRO-3, where
  // unsharded() comes and goes); mixed precision and `shards_on_cpu` (CPU offload) imply it.
  // `keep_unsharded` false (ZeRO-3): unsharded() is released once the shards are made.
  ParamBucket(std::size_t unit, std::vector<std::string> names, std::vector<at::Tensor> params, int rank, int world,
              std::optional<at::ScalarType> compute_dtype, bool separate_shards, bool shards_on_cpu,
              bool keep_unsharded);

  std::size_t unit() const { return unit_; }
  // Its parameters do not require grad (they were frozen when wrapped): all-gathered like the
  // others, never reduced; their shards do not require grad either.
  bool frozen() const { return frozen_; }
  std::vector<ShardedParam>& params() { return params_; }
  const std::vector<ShardedParam>& params() const { return params_; }
  int rank() const { return rank_; }
  int world() const { return world_; }
  int64_t chunk_numel() const { return chunk_numel_; }          // one rank's part of the wire
  int64_t unsharded_numel() const { return chunk_numel_ * world_; }
  int64_t numel() const { return numel_; }                      // the parameters' real elements

  // The padded parameters the module computes with (compute dtype).
  const at::Tensor& unsharded() const { return unsharded_; }
  // Parameter i's padded W*C rows in a tensor laid out like unsharded() (a view).
  at::Tensor region(const at::Tensor& unsharded_like, std::size_t i) const;
  // Parameter i's real rows in such a tensor, shaped as the parameter.
  at::Tensor param_view(const at::Tensor& unsharded_like, std::size_t i) const;
  // Rank `rank`'s rows of parameter i in such a tensor, shaped as its shard (e.g. a gradient's).
  at::Tensor shard_view(const at::Tensor& unsharded_like, std::size_t i) const;
  bool shards_are_separate() const { return separate_; }

  // ZeRO-3: unsharded()'s memory comes and goes; the tensor, its storage object and the
  // parameters pointing into it stay. While released it holds no bytes. release hands the memory
  // back (to reuse, or to drop); allocate takes `reuse` if it is given.
  c10::DataPtr release_unsharded();
  void allocate_unsharded(c10::DataPtr reuse = c10::DataPtr());
  bool unsharded_allocated() const;
  std::size_t unsharded_bytes() const;  // when allocated

 private:
  std::size_t unit_;
  bool frozen_;
  std::vector<ShardedParam> params_;
  int rank_, world_;
  int64_t chunk_numel_ = 0, numel_ = 0;
  bool separate_;
  at::Tensor unsharded_;
};

struct ShardOptions {
  int rank = 0, world = 1;
  std::optional<at::ScalarType> compute_dtype;  // mixed precision
  bool separate_shards = false;                 // ZeRO-3
  bool shards_on_cpu = false;                   // CPU offload
  bool keep_unsharded = true;                   // false: ZeRO-3 (released as soon as made)
  // Called with each unit's index just before its parameters are sharded (a deferred module's
  // unit is materialised there: fsdp/deferred_units.h).
  std::function<void(std::size_t)> before_unit;
};

// The units' parameters as buckets: one per dtype, device and requires_grad within each unit,
// each unit's parameters in their order. The trainable buckets come first, in the units' order,
// then the frozen ones, in the units' order: GradientSync takes the leading trainable ones.
std::vector<ParamBucket> shard_units(const std::vector<UnitPlan>& units, const ShardOptions& options);

// How many buckets lead shard_units()'s result before the frozen ones.
std::size_t trainable_bucket_count(const std::vector<ParamBucket>& buckets);

}  // namespace cpprun::detail
