// assign_buckets(): caps, the smaller first bucket, one dtype and device per bucket, order.
#include "catch.h"

#include "ddp/bucket_assignment.h"

using cpprun::detail::assign_buckets;
using cpprun::detail::BucketParam;
using Buckets = std::vector<std::vector<size_t>>;

namespace {
BucketParam param(size_t index, int64_t bytes, c10::ScalarType dtype = c10::kFloat) {
  return {index, bytes, dtype, c10::Device(c10::kCPU)};
}
}  // namespace

TEST_CASE("buckets: the first closes at its own cap, later ones at the regular cap", "[ddp]") {
  // In readiness order 5, 4, 3, 2, 1, 0; first cap 100 bytes, then 250.
  std::vector<BucketParam> order{param(5, 60), param(4, 60), param(3, 100), param(2, 100), param(1, 100), param(0, 10)};
  CHECK(assign_buckets(order, 100, 250) == Buckets{{5, 4}, {3, 2, 1}, {0}});
}

TEST_CASE("buckets: a parameter larger than the cap gets a bucket of its own", "[ddp]") {
  std::vector<BucketParam> order{param(2, 10), param(1, 1000), param(0, 10)};
  CHECK(assign_buckets(order, 5, 50) == Buckets{{2}, {1}, {0}});
}

TEST_CASE("buckets: dtypes never share a bucket; buckets ordered by first readiness", "[ddp]") {
  std::vector<BucketParam> order{param(3, 10, c10::kDouble), param(2, 10), param(1, 10, c10::kDouble), param(0, 10)};
  CHECK(assign_buckets(order, 1000, 1000) == Buckets{{3, 1}, {2, 0}});
}
