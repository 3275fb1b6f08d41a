// cpprun::AsyncSave: the handle cpprun::save_async (cpprun/state_dict.h; with an optimizer,
// cpprun/optimizer_state_dict.h) returns for a state dict being written on a background thread
// while training goes on.
//
//   auto pending = cpprun::save_async(model, "ckpt/model.safetensors");  // copies, then returns
//   ... train on ...
//   pending.wait();  // the file is on disk (a collective save: every rank's part and the index)
//
// A save's error is never lost: wait() raises it (each time it is called); when nobody waited,
// the next save (save_async or save_state_dict) raises it before it starts; a handle dropped
// before wait() first waits for the write, and when the save failed writes the error to stderr
// (the next save still raises it). See docs/checkpoints.md, "Saving without stopping training".
#pragma once

#include <memory>
#include <string>
#include <utility>

namespace cpprun {
namespace detail {
struct AsyncSaveAccess;
}  // namespace detail

class AsyncSave {
 public:
  AsyncSave() = default;  // no save: done() is true and wait() returns
  AsyncSave(AsyncSave&& other) noexcept = default;
  // The handle given up is dropped as by the destructor.
  AsyncSave& operator=(AsyncSave&& other) noexcept;
  AsyncSave(const AsyncSave&) = delete;
  AsyncSave& operator=(const AsyncSave&) = delete;
  // Waits for the write (never throws); see above for a failed save.
  ~AsyncSave();

  // Blocks until the save is on disk, or throws what made it fail. Not a collective: each rank may
  // call it when it likes. A collective save is done on a rank when every rank's file and (for a
  // directory) the index are in place, so wait() returns or throws alike on every rank.
  void wait();
  // Whether wait() would return (or throw) at once.
  bool done() const;
  // The path being saved to ("" for a default-made handle; a model and its optimizer saved
  // together: both paths, "MODEL_PATH and OPTIMIZER_PATH").
  const std::string& path() const;

 private:
  struct State;  // checkpoint/async_save.h
  friend struct detail::AsyncSaveAccess;
  explicit AsyncSave(std::shared_ptr<State> state) : state_(std::move(state)) {}
  void drop() noexcept;

  std::shared_ptr<State> state_;
};

}  // namespace cpprun
