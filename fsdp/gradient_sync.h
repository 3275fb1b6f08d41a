// Gradient reduction for FSDP, per flat parameter. Stage 1: before each backward every
// parameter's .grad is made a view of its flat parameter's flat gradient, so autograd accumulates
// straight into it, and the flat gradient is all-reduced. Stages 2 and 3: each gradient is moved
// into its flat gradient as it arrives, the flat gradient is reduce-scattered into the shard's
// gradient and released, so a full flat gradient exists only while its backward runs and its
// reduction is in flight (at most `max_in_flight` reductions at once). Either way a flat
// parameter's gradients are reduced as soon as
// all its gradients are in, while backward goes on. Scheduling only: the collectives are comm/'s.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/function.h>

#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "core/gradient_ready_hook.h"
#include "cpprun/collectives.h"
#include "fsdp/flat_param.h"
#include "fsdp/shard_groups.h"

namespace cpprun::detail {

class GradientSync {
 public:
  // reduce_dtype: the dtype gradients are reduced in (mixed precision), else their own.
  // flat_done (stage 3): called once all of a flat parameter's gradients are in, so it can go.
  // HSDP (groups.replicate): after the reduction in groups.shard, each shard's gradient is
  // averaged across the replicas.
  GradientSync(std::vector<FlatParam>& flats, const ShardGroups& groups, int stage,
               std::optional<at::ScalarType> reduce_dtype = std::nullopt,
               std::function<void(std::size_t)> flat_done = nullptr, std::size_t max_in_flight = 2);
  ~GradientSync();
  GradientSync(const GradientSync&) = delete;
  GradientSync& operator=(const GradientSync&) = delete;

  // Before a forward whose backward will (sync) or will not (no_sync) reduce gradients.
  void prepare(bool sync);
  // Called once a synchronized backward has been reduced: the shards' new values must be
  // all-gathered before the next forward.
  bool take_shards_stepped();
  // Runs after each synchronized backward has been reduced (stage 3: release the parameters).
  void on_backward_end(std::function<void()> fn) { backward_end_ = std::move(fn); }
  int64_t gradient_bytes() const;       // shard gradients, and full ones while alive
  int64_t peak_gradient_bytes() const;  // the most gradient_bytes() plus kept_bytes() has been
  int64_t kept_bytes() const;           // released full gradients kept for reuse

 private:
  enum class Mode { kFinished, kNoSync, kSync };
  struct FlatState {
    at::Tensor flat_grad;   // laid out like FlatParam::full(); undefined when released
    at::Tensor wire;        // what is reduced: flat_grad, or a copy of it in the reduce dtype
    at::Tensor shard_grad;  // stages 2 and 3: this rank's reduced part
    std::size_t pending = 0;
    bool reduced = false;   // flat_grad holds the last synchronized backward's result
    bool completed = false;
    Work work;
  };

  void on_gradient_ready(std::size_t flat, std::size_t param);
  void collect(std::size_t flat, std::size_t param);
  void launch_ready_flats();
  void complete(std::size_t flat);
  void finish_backward();
  void bind_flat_grad(std::size_t flat);
  void note_gradient_bytes();
  int64_t spare_bytes() const;
  // Full flat gradients: released ones are kept for reuse while at most max_in_flight + 1 exist
  // (see parameter_residency.h on page faults).
  at::Tensor new_flat_grad(std::size_t flat, const at::TensorOptions& options);
  void release_flat_grad(FlatState& state);

  std::vector<FlatParam>& flats_;
  ProcessGroup group_;                     // the shard group
  std::optional<ProcessGroup> replicate_;  // HSDP
  int stage_;
  std::optional<at::ScalarType> reduce_dtype_;
  std::function<void(std::size_t)> flat_done_;
  std::function<void()> backward_end_;
  std::vector<FlatState> states_;
  mutable std::mutex mutex_;
  Mode mode_ = Mode::kNoSync;  // before the first forward, gradients simply accumulate
  bool finish_queued_ = false;
  bool shards_stepped_ = false;
  std::size_t next_launch_ = 0;   // reduced last to first: see launch_ready_flats()
  std::size_t max_in_flight_;
  std::deque<std::size_t> in_flight_;
  std::vector<at::Tensor> spare_grads_;
  int64_t peak_bytes_ = 0;
  GradientReadyHooks hooks_;      // last: removed before the state the hooks touch goes
};

}  // namespace cpprun::detail
