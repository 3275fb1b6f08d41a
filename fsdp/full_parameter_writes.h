// A user's in-place write to the wrapped module's full parameters after wrapping (an
// initialisation: `p.normal_(0, 0.02)` under no_grad, `fc->weight.fill_(1)`, `.copy_(reference)`)
// carried to this rank's shards, which the optimizer steps and every later gather reads, or
// refused where it cannot be (mixed precision). Note [In-place writes to full parameters].
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/operator_name.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fsdp/param_bucket.h"

namespace cpprun::detail {

// The parameters of `bucket` whose elements `written` (a tensor over unsharded()'s storage: a
// full parameter, a view of one, its .data()) may cover, by index.
std::vector<std::size_t> params_written(const ParamBucket& bucket, const at::Tensor& written);

// Throws, naming parameter i, the operator and the rank, where a write to its full parameter
// cannot reach its shard: under mixed precision the full parameter is a low-precision copy.
void refuse_write_to_compute_copy(const ParamBucket& bucket, std::size_t i, const std::string& what, int rank);

// Copies this rank's rows of parameter i from the full parameter (allocated) into its shard.
void write_back_rows(ParamBucket& bucket, std::size_t i);

// ZeRO-1/2 under mixed precision: no dispatch key watches the full parameters, whose compute
// copies persist between all-gathers; their version counters tell a write at the next forward
// (or gather, or checkpoint), which is refused there. No cost on the operators.
class ComputeCopyVersions {
 public:
  // Records the versions of the full parameters of `buckets` whose shards are separate copies.
  explicit ComputeCopyVersions(const std::vector<ParamBucket>& buckets);
  // Throws refuse_write_to_compute_copy's error for the first one written since.
  void refuse_writes(const std::vector<ParamBucket>& buckets, int rank) const;

 private:
  struct Recorded {
    std::size_t bucket, param;
    int64_t version;
  };
  std::vector<Recorded> recorded_;
};

}  // namespace cpprun::detail
