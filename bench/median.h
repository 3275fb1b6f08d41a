// The benchmarks' summary of repeated timings: the median (for an even count, the lower of the
// two middle values, so that it is always one of the measurements).
#pragma once

#include <algorithm>
#include <vector>

namespace bench {

inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[(v.size() - 1) / 2];
}

}  // namespace bench
