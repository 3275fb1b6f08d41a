// What the multi-rank tests share: the job's process group, and slicing a global batch.
#pragma once

#include <ATen/ATen.h>

#include <chrono>

#include "cpprun/process_group.h"

namespace dist_test {

// The group every test case of a binary uses, joined on first use (60 s timeout).
inline const cpprun::ProcessGroup& group() {
  static const cpprun::ProcessGroup pg = [] {
    cpprun::ProcessGroupOptions options;
    options.timeout = std::chrono::seconds(60);
    return cpprun::init_process_group(options);
  }();
  return pg;
}

// Rank r's part of a global batch (the batch divides by the world size).
inline at::Tensor slice(const at::Tensor& global, int rank, int world) {
  const int64_t per_rank = global.size(0) / world;
  return global.narrow(0, rank * per_rank, per_rank);
}

}  // namespace dist_test
