// cpprun::NoSyncGuard: gradient accumulation. While a guard lives, backward passes only
// accumulate local gradients; the first backward after it reduces the sum.
//   { auto guard = model->no_sync(); loss1.backward(); }   // local only
//   loss2.backward();                                      // reduces loss1's + loss2's gradients
// Under FullyShardedDataParallel the guard and set_requires_gradient_sync() are one setting: the
// guard sets it false and, when it ends, puts back the value it found (fsdp.h).
#pragma once

#include <utility>

#include "cpprun/detail/data_parallel_core.h"

namespace cpprun {

template <typename ModuleType>
class DataParallelImpl;

// Made by model->no_sync() (DistributedDataParallel, FullyShardedDataParallel, DataParallel).
class NoSyncGuard {
 public:
  ~NoSyncGuard() {
    if (target_) target_->set_require_sync(was_);
  }
  NoSyncGuard(NoSyncGuard&& other) noexcept : target_(std::exchange(other.target_, nullptr)), was_(other.was_) {}
  NoSyncGuard(const NoSyncGuard&) = delete;
  NoSyncGuard& operator=(const NoSyncGuard&) = delete;
  NoSyncGuard& operator=(NoSyncGuard&&) = delete;

 private:
  template <typename ModuleType>
  friend class DataParallelImpl;
  explicit NoSyncGuard(detail::DataParallelCore& target) : target_(&target), was_(target.require_sync()) {
    target_->set_require_sync(false);
  }

  detail::DataParallelCore* target_;
  bool was_;
};

}  // namespace cpprun
