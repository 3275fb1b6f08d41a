// One unit's parameters of one dtype, laid end to end in a flat tensor padded to a multiple of
// the world size, so that it splits into equal shards. The module's parameters are rebound to
// point into the flat tensor: the module computes with them as before. With a compute dtype
// (mixed precision) the flat tensor has that dtype and the shard is a separate master copy in
// the parameters' own dtype; otherwise the shard is a part of the flat tensor itself, unless
// asked to be separate (ZeRO-3, where the flat tensor's memory is released between uses), or
// kept in CPU memory (CPU offload).
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor_alias.h"  // alias_into
#include "fsdp/unit_plan.h"

namespace cpprun::detail {

class FlatParam {
 public:
  FlatParam(std::vector<std::string> names, std::vector<at::Tensor> params, int rank, int world,
            std::optional<at::ScalarType> compute_dtype = std::nullopt, bool separate_shard = false,
            bool shard_on_cpu = false);

  const std::vector<std::string>& names() const { return names_; }
  const std::vector<at::Tensor>& params() const { return params_; }
  int64_t numel() const { return numel_; }          // the parameters' elements
  int64_t padded_numel() const { return padded_; }  // numel() rounded up to a multiple of world
  int64_t shard_numel() const { return padded_ / world_; }
  int64_t shard_offset() const { return rank_ * shard_numel(); }

  // The flat parameter the module computes with.
  const at::Tensor& full() const { return full_; }
  // This rank's part of it, as a leaf the optimizer updates (full()'s own storage unless a
  // compute dtype was given).
  const at::Tensor& shard() const { return shard_; }
  bool shard_is_separate() const { return !shard_.is_alias_of(full_); }
  // Parameter i's place in a tensor laid out like full() (e.g. the flat gradient).
  at::Tensor slot(const at::Tensor& flat, std::size_t i) const;

  // ZeRO-3: full()'s memory comes and goes; the tensor, its storage object and the parameters
  // pointing into it stay. While released, full() holds no bytes. release_full() hands the
  // memory back (to reuse, or to drop), allocate_full() takes `reuse` if it is given.
  c10::DataPtr release_full();
  void allocate_full(c10::DataPtr reuse = c10::DataPtr());
  bool full_allocated() const;
  std::size_t full_bytes() const;  // when allocated
  // Copies full()'s values (e.g. just loaded) into a separate shard.
  void shard_from_full();

 private:
  std::vector<std::string> names_;
  std::vector<at::Tensor> params_;
  std::vector<int64_t> offsets_;
  int rank_, world_;
  int64_t numel_ = 0, padded_ = 0;
  at::Tensor full_, shard_;
};

struct FlattenOptions {
  int rank = 0, world = 1;
  std::optional<at::ScalarType> compute_dtype;  // mixed precision (see FlatParam)
  bool separate_shard = false;                  // ZeRO-3
  bool shard_on_cpu = false;                    // CPU offload
  // ZeRO-3: each flat parameter's full memory goes as soon as it is made, so that wrapping a
  // model never holds more than the model plus one unit.
  bool release_full = false;
  // Called with each unit's index just before the unit is flattened (a deferred module's unit is
  // materialised there: fsdp/deferred_units.h).
  std::function<void(std::size_t)> before_unit;
};

// The units' parameters as flat parameters: one per dtype and device within each unit (a flat
// tensor has one dtype), in the units' order, each unit's parameters in their order.
// `in_root_unit[f]`: flat parameter f holds parameters of the root unit (the top-level module's own).
std::vector<FlatParam> flatten_units(const std::vector<UnitPlan>& units, const FlattenOptions& options,
                                     std::vector<bool>& in_root_unit);

}  // namespace cpprun::detail
