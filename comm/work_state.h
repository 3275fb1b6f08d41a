// What a cpprun::Work holds: the c10d work or our own task in flight, and the step to run once
// it completes (copying a converted result back, dividing for an average).
#pragma once

#include <chrono>
#include <exception>
#include <functional>
#include <future>
#include <mutex>
#include <optional>

#include "comm/c10d_types.h"
#include "comm/flight_recorder.h"
#include "cpprun/collectives.h"

namespace cpprun {

struct Work::State {
  c10::intrusive_ptr<detail::C10dWork> c10d_work;  // a backend's own collective, or
  std::shared_future<void> task;                   // one of ours on the group's executor
  std::function<void()> then;                      // runs once, on the first wait()
  std::once_flag then_once;
  std::exception_ptr then_failure;                 // what `then` threw, rethrown by every wait()
  std::optional<ProcessGroup> group;               // see Work::keep_alive
  std::shared_ptr<State> before;                   // Work::then: wait for this first
  // Its flight-recorder entry (0: none), finished by the first wait(); the group's timeout tells
  // a timeout from another failure.
  // See Note [Flight recorder].
  uint64_t recorder_id = 0;
  std::chrono::milliseconds timeout{0};

  State() = default;
  State(const State&) = delete;
  State& operator=(const State&) = delete;
  ~State();  // Note [A Work let go unfinished] in collectives.cpp
};

namespace detail {

// The library's access to what Work keeps private (users cannot name it).
struct WorkAccess {
  using State = Work::State;
  static Work make(std::shared_ptr<State> state) { return Work(std::move(state)); }
  static std::shared_ptr<State>& state(Work& work) { return work.state_; }
};

// Ties `work` to its flight-recorder entry `id` (a work with nothing to wait for completes it
// at once).
inline void attach_record(Work& work, uint64_t id, std::chrono::milliseconds timeout) {
  if (id == 0) return;
  auto& state = WorkAccess::state(work);
  if (!state) {
    record_completed(id);
    return;
  }
  state->recorder_id = id;
  state->timeout = timeout;
}

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
