// See bucket_assignment.h.
#include "ddp/bucket_assignment.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>

namespace cpprun::detail {

std::vector<std::vector<std::size_t>> assign_buckets(const std::vector<BucketParam>& order,
                                                     std::int64_t first_cap_bytes,
                                                     std::int64_t cap_bytes) {
  struct Open {
    std::vector<std::size_t> positions;  // places in `order`
    std::int64_t bytes = 0;
    bool closed_one = false;  // once a bucket of this kind is closed, later ones get cap_bytes
  };
  std::map<std::pair<int, std::string>, Open> open;  // by (dtype, device)
  std::vector<std::vector<std::size_t>> closed;      // positions, not yet parameter indices

  for (std::size_t pos = 0; pos < order.size(); ++pos) {
    const BucketParam& p = order[pos];
    Open& bucket = open[{static_cast<int>(p.dtype), p.device.str()}];
    bucket.positions.push_back(pos);
    bucket.bytes += p.bytes;
    if (bucket.bytes >= (bucket.closed_one ? cap_bytes : first_cap_bytes)) {
      closed.push_back(std::move(bucket.positions));
      bucket.positions.clear();
      bucket.bytes = 0;
      bucket.closed_one = true;
    }
  }
  for (auto& [key, bucket] : open) {
    if (!bucket.positions.empty()) closed.push_back(std::move(bucket.positions));
  }
  std::sort(closed.begin(), closed.end(),
            [](const auto& a, const auto& b) { return a.front() < b.front(); });

  std::vector<std::vector<std::size_t>> buckets;
  for (const auto& positions : closed) {
    std::vector<std::size_t> indices;
    for (std::size_t pos : positions) indices.push_back(order[pos].index);
    buckets.push_back(std::move(indices));
  }
  return buckets;
}

}  // namespace cpprun::detail
