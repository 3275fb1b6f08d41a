// Which parameters share a gradient bucket. Pure: sizes and an order in, index lists out.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace cpprun::detail {

struct BucketParam {
  std::size_t index;  // the parameter's position in the module's parameter list
  std::int64_t bytes;
  c10::ScalarType dtype;
  c10::Device device;
};

// Fills buckets in the given order (the order gradients are expected to become ready), one
// open bucket per (dtype, device) since a bucket is one flat tensor. A bucket closes once it
// holds at least its cap: `first_cap_bytes` for the first bucket of each (dtype, device),
// `cap_bytes` after. Buckets come out ordered by their first parameter's place in `order`,
// which is the order in which they will be ready.
std::vector<std::vector<std::size_t>> assign_buckets(const std::vector<BucketParam>& order,
                                                     std::int64_t first_cap_bytes,
                                                     std::int64_t cap_bytes);

}  // namespace cpprun::detail
