// Times the waits that time_waiting_for_collectives() (cpprun/step_timing.h) sums: where a thread
// blocks until the other ranks reach a collective.
#pragma once

#include <chrono>

namespace cpprun {
namespace detail {

void add_collective_wait(std::chrono::nanoseconds waited);  // comm/step_timing.cpp

// Adds the time from construction to destruction, on error too. Nested scopes (Work::then's
// chain waits for the work before it; a then step may wait for another collective) count
// once, as the outermost. Two clock reads and one relaxed atomic add: negligible next to a
// collective (docs/launcher.md, "Stragglers", has the measurement).
class CollectiveWaitScope {
 public:
  CollectiveWaitScope() : outermost_(depth()++ == 0) {
    if (outermost_) start_ = std::chrono::steady_clock::now();
  }
  ~CollectiveWaitScope() {
    --depth();
    if (outermost_) add_collective_wait(std::chrono::steady_clock::now() - start_);
  }
  CollectiveWaitScope(const CollectiveWaitScope&) = delete;
  CollectiveWaitScope& operator=(const CollectiveWaitScope&) = delete;

 private:
  static int& depth() {
    thread_local int scopes = 0;
    return scopes;
  }
  bool outermost_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace detail
}  // namespace cpprun
