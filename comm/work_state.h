// What a cpprun::Work holds: the c10d work or our own task in flight, and the step to run once
// it completes (copying a converted result back, dividing for an average).
#pragma once

#include <functional>
#include <future>
#include <mutex>
#include <optional>

#include "comm/c10d_types.h"
#include "cpprun/collectives.h"

namespace cpprun {

struct Work::State {
  c10::intrusive_ptr<detail::C10dWork> c10d_work;  // a backend's own collective, or
  std::shared_future<void> task;                   // one of ours on the group's executor
  std::function<void()> then;                      // runs once, on the first wait()
  std::once_flag then_once;
  std::optional<ProcessGroup> group;               // see Work::keep_alive
  std::shared_ptr<State> before;                   // Work::then: wait for this first
};

namespace detail {

// The library's access to what Work keeps private (users cannot name it).
struct WorkAccess {
  using State = Work::State;
  static Work make(std::shared_ptr<State> state) { return Work(std::move(state)); }
};

}  // namespace detail

// Builders for the two kinds of work.
inline Work make_work(c10::intrusive_ptr<detail::C10dWork> work, std::function<void()> then = {}) {
  auto state = std::make_shared<detail::WorkAccess::State>();
  state->c10d_work = std::move(work);
  state->then = std::move(then);
  return detail::WorkAccess::make(std::move(state));
}
inline Work make_work(std::shared_future<void> task, std::function<void()> then = {}) {
  auto state = std::make_shared<detail::WorkAccess::State>();
  state->task = std::move(task);
  state->then = std::move(then);
  return detail::WorkAccess::make(std::move(state));
}

}  // namespace cpprun
