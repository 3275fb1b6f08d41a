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
  // Puts back both halves of what it found: set_requires_gradient_sync() inside the guard also
  // sets FSDP's requires_all_reduce.
  ~NoSyncGuard() {
    if (target_) {
      target_->set_require_sync(was_);
      target_->set_requires_all_reduce(was_all_reduce_);
    }
  }
  NoSyncGuard(NoSyncGuard&& other) noexcept
      : target_(std::exchange(other.target_, nullptr)), was_(other.was_), was_all_reduce_(other.was_all_reduce_) {}
  NoSyncGuard(const NoSyncGuard&) = delete;
  NoSyncGuard& operator=(const NoSyncGuard&) = delete;
  NoSyncGuard& operator=(NoSyncGuard&&) = delete;

 private:
  template <typename ModuleType>
  friend class DataParallelImpl;
  explicit NoSyncGuard(detail::DataParallelCore& target)
      : target_(&target), was_(target.require_sync()), was_all_reduce_(target.requires_all_reduce()) {
    target_->set_require_sync(false);
  }

  detail::DataParallelCore* target_;
  bool was_;
  bool was_all_reduce_;
};

}  // namespace cpprun
