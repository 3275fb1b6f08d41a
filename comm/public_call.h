// The public call (cpprun::save_state_dict, DistributedDataParallel's backward, ...) a thread is
// in, so that a collective mismatch can say which of the library's calls each rank was making,
// not only which collective: a rank that called save_state_dict alone meets the others' next
// training collective, and "broadcast(int64[3], root 0)" against "all_reduce(float32[4096], sum)"
// does not tell the user that one rank saved and the other trained.
#pragma once

namespace cpprun::detail {

// Note [The public call of a collective]
// Each public entry that makes collectives opens a PublicCallScope with its name, as the user
// knows it. The outermost scope on the thread wins: save_state_dict(model, optimizer, dir) calls
// the model's save and the optimizer's, and a rank that made the user's call is described by
// it; a collective the user makes directly is in no scope and is described as it is. The name
// travels in the collective's fingerprint (comm/collective_fingerprint.h) for messages only: two
// ranks making the same collective from different public calls still agree (clip_grad_norm_ on
// the module or on the wrapper reach the same all-reduce by two routes). Names must be string
// literals (the scope keeps the pointer). Work started on another thread (autograd's device
// threads, an async save's writer) is in no scope unless that thread opens one.
class PublicCallScope {
 public:
  explicit PublicCallScope(const char* name) noexcept : outer_(current_) {
    if (current_ == nullptr) current_ = name;
  }
  ~PublicCallScope() { current_ = outer_; }
  PublicCallScope(const PublicCallScope&) = delete;
  PublicCallScope& operator=(const PublicCallScope&) = delete;

  // The outermost public call this thread is in, or nullptr.
  static const char* current() noexcept { return current_; }

 private:
  inline static thread_local const char* current_ = nullptr;
  const char* outer_;
};

}  // namespace cpprun::detail
