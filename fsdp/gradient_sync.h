// Gradient reduction for FSDP stages 1 and 2. Before each backward every parameter's .grad is
// made a view of its unit's flat gradient, so autograd accumulates straight into it; when all of
// a unit's gradients are in, the flat gradient is reduced while backward goes on: all-reduced
// (stage 1) or reduce-scattered into the shard's gradient (stage 2, after which the full flat
// gradient is released). Scheduling only: the collectives are comm/'s.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/function.h>

#include <memory>
#include <mutex>
#include <vector>

#include "core/gradient_ready_hook.h"
#include "cpprun/collectives.h"
#include "fsdp/flat_param.h"

namespace cpprun::detail {

class GradientSync {
 public:
  // reduce_dtype: the dtype gradients are reduced in (mixed precision), else their own.
  GradientSync(std::vector<FlatParam>& flats, ProcessGroup group, int stage,
               std::optional<at::ScalarType> reduce_dtype = std::nullopt);
  ~GradientSync();
  GradientSync(const GradientSync&) = delete;
  GradientSync& operator=(const GradientSync&) = delete;

  // Before a forward whose backward will (sync) or will not (no_sync) reduce gradients.
  void prepare(bool sync);
  // Called once a synchronized backward has been reduced: the shards' new values must be
  // all-gathered before the next forward.
  bool take_shards_stepped();
  int64_t gradient_bytes() const;

 private:
  struct UnitState {
    at::Tensor flat_grad;   // laid out like FlatParam::full(); undefined when released
    at::Tensor wire;        // what is reduced: flat_grad, or a copy of it in the reduce dtype
    at::Tensor shard_grad;  // stage 2: this rank's reduced part
    std::size_t pending = 0;
    bool reduced = false;   // flat_grad holds the last synchronized backward's result
    Work work;
  };

  void on_gradient_ready(std::size_t flat);
  void launch_ready_units();
  void finish_backward();
  void bind_flat_grad(std::size_t flat);

  std::vector<FlatParam>& flats_;
  ProcessGroup group_;
  int stage_;
  std::optional<at::ScalarType> reduce_dtype_;
  std::vector<UnitState> units_;
  std::mutex mutex_;
  bool expecting_ = false;  // a synchronized backward was prepared and has not finished
  bool finish_queued_ = false;
  bool shards_stepped_ = false;
  std::size_t next_launch_ = 0;  // units are reduced last to first: see launch_ready_units()
  GradientReadyHooks hooks_;     // last: removed before the state the hooks touch goes
};

}  // namespace cpprun::detail
