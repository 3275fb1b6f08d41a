// Gradient reduction for DistributedDataParallel: autograd hooks put each gradient into its
// bucket as soon as it is ready; a full bucket is reduced (all-reduced, or through the registered
// comm hook) while backward goes on; when backward ends, the averaged gradients are written back
// to .grad.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/function.h>

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "cpprun/comm_hooks.h"
#include "cpprun/ddp_options.h"
#include "core/gradient_ready_hook.h"
#include "cpprun/process_group.h"

namespace cpprun::detail {

// Where the reducer is within one iteration.
enum class BackwardState {
  kIdle,         // no backward expected (before the first forward, after a finished backward)
  kExpecting,    // a forward prepared a backward: hooks reduce gradients as they come
  kUnfinished,   // a backward ended with gradients missing and unused parameters not allowed
};

class Reducer {
 public:
  Reducer(std::vector<std::string> names, std::vector<at::Tensor> params, ProcessGroup group,
          DdpOptions options);
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // Before a forward that will reduce (will_reduce): throws if the previous backward left
  // gradients unreduced, and forgets a prepared backward that never came. Else nothing.
  void check_previous_backward(bool will_reduce);
  // Refuses parameters whose dtype or device differs from when they were wrapped (Note [A module
  // converted after wrapping]).
  void check_parameters_as_wrapped() const;
  // Before a forward: after the first synchronized backward, re-buckets once in the order in
  // which rank 0's gradients became ready. Collective.
  void rebuild_buckets_if_due();
  // After a forward that will be followed by a synchronized backward.
  void prepare_for_backward(const std::vector<at::Tensor>& outputs);
  // On a rank whose inputs ran out (join): take part in one backward's reductions with zeros.
  void reduce_as_joined_rank();
  // A pipeline stage's step (manual finalization): before the stage's last backward of the step,
  // so that its buckets are reduced as their gradients (the micro-batches' sums) become ready in
  // it, while the pipeline goes on. Nothing ends the reduction but reduce_accumulated().
  void prepare_for_last_backward();
  // A pipeline stage's step (manual finalization): the gradients its micro-batches' backwards
  // accumulated, reduced as one synchronized backward's would be: those the last backward did not
  // reduce (all, without prepare_for_last_backward), then waits for every bucket. Collective.
  void reduce_accumulated();

  void set_comm_hook(std::shared_ptr<CommHook> hook);
  std::size_t bucket_count() const { return buckets_.size(); }
  // Each bucket's parameter indices, buckets in reduction order (for tests and diagnostics).
  std::vector<std::vector<std::size_t>> bucket_parameters() const;
  // The buckets' buffers' bytes: none alone without a hook (Note [Nothing to reduce alone]).
  int64_t bucket_bytes() const;

 private:
  struct Bucket {
    std::vector<std::size_t> params;  // parameter indices, in buffer order
    std::vector<int64_t> offsets;     // each one's first element in `buffer`
    int64_t numel = 0;                // their elements, end to end
    at::Tensor buffer;                // numel elements; none while leaves_gradients()
    std::size_t pending = 0;          // gradients still to come in this backward
    Work work;
  };

  void build_buckets(const std::vector<std::size_t>& order);
  at::Tensor slot(std::size_t param) const;
  bool detects_unused() const;

  // Called by the autograd hook of parameter `param` once its .grad holds this backward's gradient.
  void on_gradient_ready(std::size_t param);
  void mark_ready(std::size_t param, bool used);
  // Its .grad (zeros if it has none), scaled by 1/world_size without a hook, into its bucket slot.
  void copy_into_bucket(std::size_t param);
  Work reduce(Bucket& bucket, std::size_t index);
  void launch_ready_buckets();
  void expect_gradients();  // a new iteration's reduction: no gradient in yet (mutex_ held)
  void finish_backward();  // queued on the autograd engine: runs when backward ends
  void complete_reduction();  // every bucket launched: wait, write back, go idle (mutex_ held)
  std::vector<bool> reduce_used_flags();
  void write_back_gradients(const std::vector<bool>& globally_used);
  std::string unready_parameter_list() const;

  std::vector<std::string> names_;
  std::vector<at::Tensor> params_;
  std::vector<at::TensorOptions> wrapped_as_;  // each parameter's dtype and device when wrapped
  ProcessGroup group_;
  DdpOptions options_;
  // Null unless one was registered. Null means the built-in all-reduce, whose 1/world_size
  // scaling is done while the gradients are copied in, saving a pass over every gradient (as
  // PyTorch's reducer does). A registered hook gets the unscaled gradients, as comm_hooks.h says.
  std::shared_ptr<CommHook> hook_;
  at::Tensor average_scale_;  // 1/world_size, as a wrapped scalar: keeps the gradient's dtype
  // Note [Nothing to reduce alone]: one rank and the built-in reduction leave every .grad as it is.
  bool leaves_gradients() const { return hook_ == nullptr && group_.size() == 1; }
  void allocate_buffers();  // the buckets' that have none, unless leaves_gradients()

  std::vector<Bucket> buckets_;
  std::vector<std::pair<std::size_t, std::size_t>> location_;  // param -> (bucket, slot)

  // One iteration's state; guarded by mutex_ since hooks run on autograd's threads.
  std::mutex mutex_;
  BackwardState state_ = BackwardState::kIdle;
  std::vector<bool> ready_;
  std::vector<bool> used_here_;
  std::size_t next_bucket_ = 0;
  bool finish_queued_ = false;
  bool manual_end_ = false;  // prepare_for_last_backward's: reduce_accumulated ends it, not the engine
  // Found unused by the forward, marked ready at the backward's first gradient (Note [Unused
  // parameters join at the backward's start]).
  std::vector<std::size_t> unused_waiting_;

  // Across iterations.
  int64_t synced_backwards_ = 0;
  bool buckets_rebuilt_ = false;
  std::vector<std::size_t> ready_order_;        // first synchronized backward's order
  // static_graph: what the first synchronized backward found, then taken as fixed.
  struct StaticUnused {
    std::vector<bool> here;        // no gradient on this rank: marked ready at each backward's start
    std::vector<bool> everywhere;  // no gradient on any rank: .grad left untouched
  };
  std::optional<StaticUnused> static_unused_;
  void remember_static_unused(const std::vector<bool>& globally_used);

  GradientReadyHooks hooks_;  // last: removed before the state the hooks touch goes
};

}  // namespace cpprun::detail
