// The one place that knows how LibTorch 1.13's c10d differs from 2.x's. Everything else in
// comm/ talks to `C10dGroup` and the helpers below.
#pragma once

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/version.h>

#ifdef CPPRUN_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <chrono>
#include <string>

namespace cpprun::detail {

// In 1.13 each backend *is* a c10d::ProcessGroup; in 2.x a backend is a c10d::Backend that a
// c10d::ProcessGroup dispatches to. Both offer the same collective methods, so we hold the
// backend itself.
#if TORCH_VERSION_MAJOR >= 2
using C10dGroup = c10d::Backend;
#else
using C10dGroup = c10d::ProcessGroup;
#endif

using C10dWork = c10d::Work;

}  // namespace cpprun::detail
