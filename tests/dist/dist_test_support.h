// What the multi-rank tests share: the job's process group, slicing a global batch, and a call's
// error as text.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <chrono>
#include <functional>
#include <string>

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

// What `run` throws as a c10::Error, without its backtrace; "" when it returns (another exception
// passes through, failing the test case).
inline std::string error_of(const std::function<void()>& run) {
  try {
    run();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

}  // namespace dist_test
