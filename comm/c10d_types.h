// The c10d types comm/ builds on. In LibTorch 2.x a backend (Gloo, NCCL) is a c10d::Backend that
// a c10d::ProcessGroup dispatches to; we hold the backends themselves and pick one per tensor.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#ifdef CPPRUN_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace cpprun::detail {

using C10dGroup = c10d::Backend;
using C10dWork = c10d::Work;

}  // namespace cpprun::detail
