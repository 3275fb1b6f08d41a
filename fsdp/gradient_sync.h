// Gradient reduction for FSDP, per bucket (a unit's parameters of one dtype). Stage 1: each
// parameter's gradient goes into its rows of the bucket's full gradient, laid out like the
// bucket's unsharded parameters (copied there as it comes in a synchronized backward after a
// reduction; otherwise .grad is a view of the rows and autograd accumulates into it: Note
// [Stage 1's full gradient is overwritten, not zeroed] in gradient_sync.cpp); it is
// reduce-scattered (Note [Stage 1 reduce-scatters] in gradient_sync.cpp), the result written
// back into this rank's rows, and each shard's gradient is a view of them (with a reduce dtype of
// its own, of the reduced chunk). Stages 2 and 3: each parameter's gradient is
// taken from its .grad as it arrives and held; once the bucket's are all in they are
// reduce-scattered straight from where autograd left them into this rank's chunk, whose views
// are the shards' gradients, and dropped, so a full gradient exists only while its bucket's
// backward runs and its reduction is in flight (at most `max_in_flight` reductions at once).
// A shard .grad the optimizer kept since the last reduction (not set to none) gets the new one
// added, as FSDP2's does (Note [Shard gradients accumulate] in fsdp_collectives.cpp).
// Either way a bucket is reduced as soon as all its gradients are in, while backward goes on.
// Until the next forward, each full parameter's .grad is then a guard that refuses an optimizer
// built over them (full_gradient_guard.h).
// Alone in the shard group (stages 2 and 3, no replicas) there is nothing to reduce: each shard's
// gradient is the parameter's own, as autograd made it.
// HSDP with the replicas' all-reduce off (set_all_reduce(false)): each bucket's reduced chunk is
// set aside, summed over such backwards, and added in before the next all-reduce (Note [HSDP
// all-reduce skipped]).
// Scheduling only: the wire work is fsdp_collectives.h's.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/function.h>

#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "core/gradient_ready_hook.h"
#include "cpprun/collectives.h"
#include "fsdp/fsdp_collectives.h"
#include "fsdp/param_bucket.h"
#include "fsdp/shard_groups.h"

namespace cpprun::detail {

class FullGradientGuard;  // full_gradient_guard.h

struct GradientSyncOptions {
  // Stages 2 and 3: each gradient held until reduced, then dropped; else (stage 1) one full
  // gradient per bucket, kept.
  bool shard_gradients = true;
  // Mixed precision's; else each bucket's parameters' own (the shards', not the compute dtype:
  // FSDP2's default since PyTorch 2.15). Local backwards accumulate in it too (stages 2 and 3).
  std::optional<at::ScalarType> reduce_dtype;
  std::size_t max_in_flight = 2;
  // The buckets in the order every rank reduces them (a permutation of their indices): the order
  // a backward finishes them in, as fsdp_core plans it (Note [FSDP reduction order]). Empty: last
  // to first.
  std::vector<std::size_t> reduction_order;
};

class GradientSync {
 public:
  // bucket_done (stage 3): called once all of a bucket's gradients are in, so its parameters can
  // go, in synchronized and local backwards alike. HSDP (groups.replicate): after the reduction
  // in groups.shard, each shard's gradient is averaged across the replicas.
  // `buckets`: the trainable ones (frozen buckets have nothing to reduce).
  GradientSync(std::span<ParamBucket> buckets, const ShardGroups& groups, GradientSyncOptions options,
               std::function<void(std::size_t)> bucket_done = nullptr);
  ~GradientSync();
  GradientSync(const GradientSync&) = delete;
  GradientSync& operator=(const GradientSync&) = delete;

  // Before a forward whose backward will (sync) or will not (no_sync) reduce gradients.
  void prepare(bool sync);
  // The prepared backward has not started yet: it will (sync) or will not reduce after all, as
  // FSDP2 decides when backward reaches a unit. Once it has started, the next prepare() decides.
  void set_sync(bool sync);
  // HSDP: whether a synchronized backward all-reduces across the replicas; off, the reduced chunks
  // wait for the next backward that does (Note [HSDP all-reduce skipped]). Read as each bucket
  // completes. Nothing to skip without replicas.
  void set_all_reduce(bool all_reduce);
  bool all_reduce_enabled() const { return all_reduce_; }
  // FSDP2's set_gradient_divide_factor (none: the data-parallel size, an average) and
  // set_force_sum_reduction_for_comms: how each reduction scales the sum (GradientDivision in
  // fsdp_collectives.h). Read as each bucket's reduction starts.
  void set_gradient_divide_factor(std::optional<double> factor);
  void set_force_sum_reduction(bool force_sum);
  // FSDP2's set_all_reduce_hook: called with this rank's reduced rows of each bucket (in the
  // reduce dtype, 1-D, in the wire layout) after the shard group's reduction and HSDP's
  // all-reduce, before the division after them; it may change them in place. Runs with this
  // object's lock held, in backward: it must not call into the wrapper. Null: none.
  void set_all_reduce_hook(std::function<void(const at::Tensor&)> hook);
  // Manual finalization (a pipeline stage): reduces every gradient accumulated since the last
  // reduction, as the end of a synchronized backward would. Collective.
  void finalize();
  // Called once a synchronized backward has been reduced: the shards' new values must be
  // all-gathered before the next forward.
  bool take_shards_stepped();
  bool shards_stepped() const;  // the same, leaving it set
  // Runs after each backward: `reduced` when it was synchronized and has been reduced, else at the
  // end of a local one (stage 3: release the parameters).
  void on_backward_end(std::function<void(bool reduced)> fn) { backward_end_ = std::move(fn); }
  int64_t gradient_bytes() const;       // shard gradients, and full ones while held
  int64_t peak_gradient_bytes() const;  // the most gradient_bytes() has been

 private:
  enum class Mode { kFinished, kNoSync, kSync };
  struct BucketState {
    at::Tensor full_grad;   // stage 1: laid out like unsharded(), .grad views of it
    at::Tensor wire;        // stage 1: what is reduced: full_grad, or a copy of it in the reduce dtype
    // Stages 2 and 3: each parameter's full gradient, until reduced (local backwards' sum, in the
    // reduce dtype, where it differs from the compute dtype: Note [Local gradients in the reduce dtype]).
    std::vector<at::Tensor> grads;
    std::vector<bool> held_local;  // grads[i] is local backwards' sum, kept until reduced
    at::Tensor chunk;       // this rank's reduced part (stage 1: until written back into full_grad)
    at::Tensor set_aside;   // HSDP, all-reduce off: this rank's reduced rows awaiting the all-reduce
    std::size_t pending = 0;
    bool reduced = false;   // stage 1: the last synchronized backward's reduction is done (the shards have it)
    // Stage 1, a synchronized backward prepared after a reduction: full_grad still holds that
    // reduction's leftovers, and each gradient is copied over its rows as it comes (Note [Stage
    // 1's full gradient is overwritten, not zeroed]).
    bool stale = false;
    bool completed = false;
    GradientDivision division;  // the reduction in flight's
    std::function<void(const at::Tensor&)> hook;  // the same
    bool alone = false;         // Note [Nothing to reduce-scatter alone] applies to it
    Work work;
  };

  void on_gradient_ready(std::size_t bucket, std::size_t param);
  void collect(std::size_t bucket, std::size_t param);
  at::ScalarType reduce_dtype_of(std::size_t bucket) const;
  bool accumulates_apart(std::size_t bucket) const;
  void warn_stage_1_accumulates_narrow() const;
  void hold_local_gradient(std::size_t bucket, std::size_t param);
  void drop_held_gradients(BucketState& state);
  void launch_ready_buckets();
  void complete(std::size_t bucket);
  void complete_full_gradient(std::size_t bucket);  // stage 1's part of complete()
  void finish_backward();
  void finish_local_backward();
  // HSDP: averages `mine` (this rank's reduced rows, its own memory) across the replicas, adding
  // what was set aside first; or, all-reduce off, sets it aside (taking it). Returns whether
  // `mine` now holds the average.
  bool average_across_replicas(BucketState& state, at::Tensor& mine);
  GradientDivision division_for(std::size_t bucket) const;
  void clear_reductions();  // no bucket launched or completed yet (mutex_ held)
  // Stage 1: readies the bucket's full gradient for a backward, synchronized or local (`sync`).
  void bind_full_grad(std::size_t bucket, bool sync);
  // Stage 1, stale: the gradients that came copied in, zeros elsewhere; every .grad a view.
  void settle_stale_full_grad(std::size_t bucket);
  // Stage 1: a .grad that is not a view of its rows (autograd's own tensor) copied over them.
  void take_into_full_grad(std::size_t bucket, std::size_t param);
  void note_gradient_bytes();
  int64_t held_gradient_bytes() const;  // gradient_bytes(), mutex_ held

  std::span<ParamBucket> buckets_;
  ProcessGroup group_;                     // the shard group
  std::optional<ProcessGroup> replicate_;  // HSDP
  GradientSyncOptions options_;
  bool alone_;  // stages 2 and 3 in a shard group of one, no replicas: Note [Nothing to reduce-scatter alone]
  std::function<void(std::size_t)> bucket_done_;
  std::function<void(bool)> backward_end_;
  std::vector<BucketState> states_;
  mutable std::mutex mutex_;
  Mode mode_ = Mode::kNoSync;  // before the first forward, gradients simply accumulate
  bool finish_queued_ = false;   // a backward has started since prepare()
  bool prepared_ = false;        // prepare() ran and its backward has not started
  bool forwarded_ = false;       // prepare() ran once: a forward went through the wrapper
  bool all_reduce_ = true;       // HSDP: see set_all_reduce
  std::optional<double> divide_factor_;
  std::function<void(const at::Tensor&)> all_reduce_hook_;
  bool force_sum_ = false;
  bool shards_stepped_ = false;
  std::vector<std::size_t> order_;  // options_.reduction_order, or last to first
  std::size_t next_launch_ = 0;     // order_[next_launch_] is the next bucket to reduce
  std::deque<std::size_t> in_flight_;
  int64_t peak_bytes_ = 0;
  // The full parameters' .grad from a synchronized backward's end to the next forward (Note [Full
  // gradients after a synchronized backward] in full_gradient_guard.cpp).
  std::unique_ptr<FullGradientGuard> full_grad_guard_;
  GradientReadyHooks hooks_;      // last: removed before the state the hooks touch goes
};

}  // namespace cpprun::detail
