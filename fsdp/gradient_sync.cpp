// See gradient_sync.h.
#include "fsdp/gradient_sync.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/engine.h>

#include <algorithm>
#include <unordered_set>

#include "comm/public_call.h"
#include "fsdp/fsdp_collectives.h"
#include "fsdp/full_gradient_guard.h"

namespace cpprun::detail {
namespace {

// What the gradient reductions are named in a mismatch (Note [The public call of a collective]).
constexpr const char* kFsdpBackward = "FullyShardedDataParallel's backward";

bool shard_grads_defined(const ParamBucket& bucket) {
  for (const ShardedParam& s : bucket.params()) {
    if (s.shard.grad().defined()) return true;
  }
  return false;
}

bool shard_grads_alias(const ParamBucket& bucket, const at::Tensor& memory) {
  for (const ShardedParam& s : bucket.params()) {
    if (s.shard.grad().defined() && s.shard.grad().is_alias_of(memory)) return true;
  }
  return false;
}

}  // namespace

GradientSync::GradientSync(std::span<ParamBucket> buckets, const ShardGroups& groups, GradientSyncOptions options,
                           std::function<void(std::size_t)> bucket_done)
    : buckets_(buckets),
      group_(groups.shard),
      replicate_(groups.replicate),
      options_(options),
      alone_(options.shard_gradients && groups.shard.size() == 1 && !groups.replicate),
      bucket_done_(std::move(bucket_done)),
      states_(buckets.size()),
      full_grad_guard_(std::make_unique<FullGradientGuard>(buckets, groups.whole.rank())) {
  order_ = options_.reduction_order;
  if (order_.empty()) {
    for (std::size_t b = buckets_.size(); b-- > 0;) order_.push_back(b);
  }
  std::vector<bool> seen(buckets_.size(), false);
  for (std::size_t b : order_) {
    TORCH_INTERNAL_ASSERT(b < seen.size() && !seen[b], "GradientSync: the reduction order is not a permutation");
    seen[b] = true;
  }
  TORCH_INTERNAL_ASSERT(order_.size() == buckets_.size(), "GradientSync: the reduction order misses buckets");
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    states_[b].grads.resize(buckets_[b].params().size());
    states_[b].held_local.resize(buckets_[b].params().size(), false);
    for (std::size_t i = 0; i < buckets_[b].params().size(); ++i) {
      hooks_.add(buckets_[b].params()[i].param, [this, b, i] {
        PublicCallScope call(kFsdpBackward);
        on_gradient_ready(b, i);
      });
    }
  }
}

GradientSync::~GradientSync() = default;

// Note [Stage 1's full gradient is overwritten, not zeroed]
// Stage 1's .grad are views of the bucket's full gradient, so that local (no_sync) backwards
// accumulate into it and the reduction reads it whole. A synchronized backward after a reduction
// used to zero it and let autograd add each gradient into its view: a write of the whole bucket,
// then two reads and a write for each gradient, where the gradient itself is all it holds. So
// such a backward leaves .grad none (autograd then hands over the gradient it made, or a copy
// where it cannot take it over), and each gradient is copied over its rows when it comes; the
// rows of parameters that got none, and the padding rows (zeros on every rank, that a comm hook
// sees), are zeroed when the bucket launches. A local backward, or one after local ones
// (accumulating), still binds the views first. What it saves is the zeroing (perf, 2 ranks, 4.2M
// parameters: the fill kernel's samples fell from 95 to 8 in 63 steps, about 1.4 ms a step); the
// add became a copy of about the same cost (docs/fsdp.md). Whatever the mode, a .grad that is not
// a view when it comes (autograd replaced the view: create_graph adds out of place) is copied
// over its rows, so the reduction and later local backwards see it.

// Stage 1. A fresh backward starts from zero (or overwrites the rows, when synchronized) unless
// no_sync backwards are accumulating in full_grad.
void GradientSync::bind_full_grad(std::size_t b, bool sync) {
  BucketState& state = states_[b];
  ParamBucket& bucket = buckets_[b];
  if (!state.full_grad.defined()) {
    state.full_grad = at::zeros_like(bucket.unsharded());
  } else if (state.reduced || state.chunk.defined()) {
    // A shard .grad the optimizer kept (not set to none) is a view of these rows: it becomes a
    // copy of its own, to which the next reduction adds (Note [Shard gradients accumulate]).
    for (const ShardedParam& s : bucket.params()) {
      at::Tensor& grad = s.shard.mutable_grad();
      if (grad.defined() && grad.is_alias_of(state.full_grad)) grad = grad.clone();
    }
    // The rest of the last backward's sum, and the reduce-scatter's partial sums in the other
    // rows (a chunk still here: its reduction failed, and the error was caught): a synchronized
    // backward overwrites them, a local one starts from zeros.
    state.chunk = at::Tensor();
    state.stale = true;
  }
  state.reduced = false;
  if (state.stale && sync) {
    for (const ShardedParam& s : bucket.params()) s.param.mutable_grad() = at::Tensor();
    return;
  }
  if (state.stale) {
    state.full_grad.zero_();
    state.stale = false;
  }
  at::NoGradGuard no_grad;
  for (std::size_t i = 0; i < bucket.params().size(); ++i) {
    // Autograd adds each new gradient into this view in place: no copy into a bucket.
    bucket.params()[i].param.mutable_grad() = bucket.param_view(state.full_grad, i);
  }
}

void GradientSync::take_into_full_grad(std::size_t b, std::size_t i) {
  BucketState& state = states_[b];
  at::Tensor& grad = buckets_[b].params()[i].param.mutable_grad();
  if (!state.full_grad.defined() || !grad.defined() || grad.is_alias_of(state.full_grad)) return;
  at::NoGradGuard no_grad;
  at::Tensor rows = buckets_[b].param_view(state.full_grad, i);
  if (grad.is_sparse()) {
    rows.zero_();
    rows.add_(grad);  // no dense copy of the whole parameter
  } else {
    rows.copy_(grad);
  }
  grad = std::move(rows);
}

void GradientSync::settle_stale_full_grad(std::size_t b) {
  BucketState& state = states_[b];
  if (!state.stale) return;
  state.stale = false;
  ParamBucket& bucket = buckets_[b];
  at::NoGradGuard no_grad;
  for (std::size_t i = 0; i < bucket.params().size(); ++i) {
    const ShardedParam& s = bucket.params()[i];
    at::Tensor region = bucket.region(state.full_grad, i);
    at::Tensor& grad = s.param.mutable_grad();
    // A gradient that came and was not yet taken (set_sync(false) from a hook mid-backward).
    take_into_full_grad(b, i);
    if (grad.defined()) {
      const int64_t real = s.rows * s.row_numel;  // the padding after its rows
      if (region.numel() > real) region.narrow(0, real, region.numel() - real).zero_();
    } else {
      region.zero_();
      grad = bucket.param_view(state.full_grad, i);
    }
  }
}

void GradientSync::prepare(bool sync) {
  std::lock_guard<std::mutex> lock(mutex_);
  full_grad_guard_->disarm();
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    // Stages 2 and 3 collect gradients as they come; under no_sync, .grad accumulates as usual.
    if (!options_.shard_gradients) bind_full_grad(b, sync);
    states_[b].pending = buckets_[b].params().size();
    // What a synchronized backward that failed (an error caught) collected is not carried into
    // this one; local backwards' sums are (Note [Local gradients in the reduce dtype]).
    for (std::size_t i = 0; i < states_[b].grads.size(); ++i) {
      if (!states_[b].held_local[i]) states_[b].grads[i] = at::Tensor();
    }
  }
  note_gradient_bytes();
  if (!sync && !options_.shard_gradients) warn_stage_1_accumulates_narrow();
  mode_ = sync ? Mode::kSync : Mode::kNoSync;
  finish_queued_ = false;
  prepared_ = true;
  forwarded_ = true;
  clear_reductions();
}

// prepare() did the same for either mode but stage 1's (settled here for a local backward): what
// happens as the gradients arrive differs.
void GradientSync::set_sync(bool sync) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!prepared_) return;
  mode_ = sync ? Mode::kSync : Mode::kNoSync;
  // Stage 1: a local backward accumulates into the views (Note [Stage 1's full gradient is
  // overwritten, not zeroed]); no gradient has come yet.
  if (!sync) {
    for (std::size_t b = 0; b < states_.size(); ++b) settle_stale_full_grad(b);
  }
}

void GradientSync::set_all_reduce(bool all_reduce) {
  std::lock_guard<std::mutex> lock(mutex_);
  all_reduce_ = all_reduce;
}

void GradientSync::set_gradient_divide_factor(std::optional<double> factor) {
  std::lock_guard<std::mutex> lock(mutex_);
  divide_factor_ = factor;
}

void GradientSync::set_force_sum_reduction(bool force_sum) {
  std::lock_guard<std::mutex> lock(mutex_);
  force_sum_ = force_sum;
}

void GradientSync::set_all_reduce_hook(std::function<void(const at::Tensor&)> hook) {
  std::lock_guard<std::mutex> lock(mutex_);
  all_reduce_hook_ = std::move(hook);
}

at::ScalarType GradientSync::reduce_dtype_of(std::size_t b) const {
  return options_.reduce_dtype.value_or(buckets_[b].params().front().shard.scalar_type());
}

// Note [Local gradients in the reduce dtype]
// Under mixed precision autograd makes each gradient in the compute dtype (bf16), and a local
// (no_sync) backward's .grad accumulated there: each micro-batch's sum rounded to bf16 before the
// fp32 reduction, an error growing with the micro-batches (0.5% after 4, an audit of 2026-12-07).
// FSDP2 accumulates in the reduce dtype (its unsharded_accumulated_grad), so stages 2 and 3 here
// take each local gradient off .grad as it comes and add it to the held gradient, made in the
// reduce dtype; the synchronized backward adds its own and reduces the sum. Where the dtypes are
// the same nothing changes: autograd accumulates in .grad, the held gradient taken at the end.
// Stage 1 accumulates in its full gradient, laid out in the compute dtype (docs/fsdp.md).
bool GradientSync::accumulates_apart(std::size_t b) const {
  return options_.shard_gradients && reduce_dtype_of(b) != buckets_[b].unsharded().scalar_type();
}

// Stage 1's local backwards sum in the compute dtype, where FSDP2 and stages 2 and 3 sum in the
// reduce dtype: said once, at the first local backward that would round (an audit, 2026-12-07:
// 0.5% from FSDP2 after 4 steps of 3 micro-batches, bf16 against float32, without a word).
void GradientSync::warn_stage_1_accumulates_narrow() const {
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    const at::ScalarType compute = buckets_[b].unsharded().scalar_type();
    if (reduce_dtype_of(b) == compute) continue;
    TORCH_WARN_ONCE("cpprun::FullyShardedDataParallel: stage 1 sums no_sync backwards in its full gradient, in ",
                    compute, " (param_dtype), and rounds each micro-batch's sum there before the ", reduce_dtype_of(b),
                    " reduction; stages 2 and 3 (as FSDP2) sum them in reduce_dtype. For many micro-batches under "
                    "mixed precision use stage 2, which sends the same and holds less.");
    return;
  }
}

void GradientSync::drop_held_gradients(BucketState& state) {
  for (auto& grad : state.grads) grad = at::Tensor();
  state.held_local.assign(state.grads.size(), false);
}

void GradientSync::hold_local_gradient(std::size_t b, std::size_t i) {
  at::Tensor& grad = buckets_[b].params()[i].param.mutable_grad();
  if (!grad.defined()) return;
  states_[b].held_local[i] = true;
  at::Tensor& held = states_[b].grads[i];
  at::NoGradGuard no_grad;
  if (held.defined()) {
    held.add_(grad);
  } else {
    held = grad.to(reduce_dtype_of(b));
  }
  grad = at::Tensor();
}

GradientDivision GradientSync::division_for(std::size_t b) const {
  return gradient_division(group_.size(), replicate_ ? replicate_->size() : 1, reduce_dtype_of(b), divide_factor_,
                           force_sum_);
}

void GradientSync::clear_reductions() {
  for (auto& state : states_) state.completed = false, state.work = Work();
  next_launch_ = 0;
  in_flight_.clear();
}

void GradientSync::on_gradient_ready(std::size_t b, std::size_t i) {
  std::lock_guard<std::mutex> lock(mutex_);
  // A forward through the bare module rather than the wrapper prepares nothing: its backward used
  // to accumulate locally without a word, and the shards never got a gradient (an audit,
  // 2026-12-07). FSDP2 hooks the module itself, so there is no forward around it to miss.
  TORCH_CHECK(forwarded_, "cpprun::FullyShardedDataParallel: backward reached the parameters, but no forward ran "
              "through the wrapper: call the wrapper's forward (model->forward(x)), not the wrapped module's "
              "(net->forward(x), model->module()->forward(x)), so that FSDP reduces the gradients into the shards "
              "the optimizer steps.");
  TORCH_CHECK(mode_ != Mode::kFinished, "cpprun::FullyShardedDataParallel: backward reached the parameters again after "
              "the gradients of the last forward were already reduced: a second backward through the same graph "
              "(retain_graph), or a forward through the wrapped module rather than the wrapper. Run the wrapper's "
              "forward (model->forward(x)) before each backward.");
  prepared_ = false;
  // Stage 1, either mode: a gradient autograd handed over (a stale bucket) or a .grad it replaced
  // (create_graph) goes into its rows (Note [Stage 1's full gradient is overwritten, not zeroed]).
  if (!options_.shard_gradients) take_into_full_grad(b, i);
  if (mode_ == Mode::kNoSync) {
    // A local backward: .grad accumulates as autograd leaves it; stage 3 still hears when each
    // bucket is done and when backward ends, to release the parameters (reshard_after_backward).
    if (!finish_queued_ && backward_end_) {
      finish_queued_ = true;
      torch::autograd::Engine::get_default_engine().queue_callback([this] {
        PublicCallScope call(kFsdpBackward);
        finish_local_backward();
      });
    }
    if (accumulates_apart(b)) hold_local_gradient(b, i);
    // A second backward through one graph (retain_graph) counts afresh: Note [Local backward again].
    if (states_[b].pending > 0 && --states_[b].pending == 0 && bucket_done_) bucket_done_(b);
    return;
  }
  if (!finish_queued_) {
    finish_queued_ = true;
    torch::autograd::Engine::get_default_engine().queue_callback([this] {
      PublicCallScope call(kFsdpBackward);
      finish_backward();
    });
  }
  if (options_.shard_gradients) collect(b, i);
  if (--states_[b].pending == 0 && bucket_done_) bucket_done_(b);
  launch_ready_buckets();
}

// Stages 2 and 3: the parameter's gradient (this backward's, plus any no_sync accumulation) is
// taken from .grad and held, as autograd made it, until its bucket is reduced; added to the
// local backwards' sum where that is held apart (Note [Local gradients in the reduce dtype]).
void GradientSync::collect(std::size_t b, std::size_t i) {
  at::Tensor& grad = buckets_[b].params()[i].param.mutable_grad();
  if (!grad.defined()) return;
  at::Tensor& held = states_[b].grads[i];
  if (held.defined()) {
    at::NoGradGuard no_grad;
    held.add_(grad);
    grad = at::Tensor();
    return;
  }
  held = std::exchange(grad, at::Tensor());
}

// Note [FSDP reduction order]
// Every rank reduces the buckets in one fixed order (the k-th launched only after the ones
// before), because collectives are matched by the order ranks issue them; a bucket whose
// gradients are all in waits for the ones before it. So the order should be the one a backward
// finishes them in: the reverse of the order the forward first uses each unit. fsdp_core takes
// the reverse of the units' pre-order (children before their parent, later siblings before
// earlier ones; a unit's buckets last to first). It was the reverse of the units' post-order,
// which puts the root first: but the root's own parameters include what the forward uses first
// (a GPT's token and position embeddings, an input projection), whose gradients come last, so
// every block's full gradients waited for the end of the backward, all alive at once, and no
// reduction overlapped the backward (an audit, 2026-12-07: 202 MB of gradients at the peak where
// 67 MB was due, with gathered_unit_limit(1)). FSDP2 reduces each group in its post-backward
// hook, as backward reaches it, trusting every rank to reach them in the same order; the root's
// last.
void GradientSync::launch_ready_buckets() {
  while (next_launch_ < order_.size()) {
    const std::size_t b = order_[next_launch_];
    BucketState& state = states_[b];
    ParamBucket& bucket = buckets_[b];
    if (state.pending != 0) return;
    // See Note [Gradient divide factor] in fsdp_collectives.cpp.
    state.division = division_for(b);
    state.hook = all_reduce_hook_;
    // A hook needs this rank's reduced rows as one tensor, which alone only a reduce-scatter in the
    // group of one makes.
    state.alone = alone_ && !state.hook;
    if (!options_.shard_gradients) {
      // finalize() again with no backward since: the shards have this gradient's reduction
      // already, so there is nothing to reduce or complete.
      state.completed = state.reduced;
      if (!state.completed) {
        settle_stale_full_grad(b);
        const auto dtype = reduce_dtype_of(b);
        state.wire = dtype != state.full_grad.scalar_type() ? state.full_grad.to(dtype) : state.full_grad;
        state.wire = scaled_before_reduction(state.division, state.wire, state.wire.scalar_type());
        // See Note [Stage 1 reduce-scatters]. Alone in the shard group the wire is the sum already.
        if (group_.size() > 1) {
          state.chunk = at::empty({bucket.chunk_numel()}, state.wire.options());
          state.work = reduce_scatter_unsharded_gradient(group_, bucket, state.chunk, state.wire,
                                                         state.division.shard_op);
        }
      }
    } else if (state.alone) {
      // Note [Nothing to reduce-scatter alone]: complete() hands each gradient to its shard.
    } else {
      // A fresh chunk where a shard .grad the optimizer kept is a view of the last one: the
      // reduction adds to it (Note [Shard gradients accumulate]), and must not overwrite it.
      const auto dtype = reduce_dtype_of(b);
      if (!state.chunk.defined() || shard_grads_alias(bucket, state.chunk)) {
        state.chunk = at::empty({bucket.chunk_numel()}, bucket.unsharded().options().dtype(dtype));
      }
      // A division before the reduction (FSDP2's, on its reduce-dtype input) holds each gradient in
      // the reduce dtype; without one the ring converts as it goes.
      for (auto& grad : state.grads) grad = scaled_before_reduction(state.division, grad, dtype);
      // Parameters that got no gradient count as zeros: gradient_chunks() leaves them out.
      state.work = reduce_scatter_gradients(group_, bucket, state.chunk, state.grads, state.division.shard_op);
    }
    ++next_launch_;
    // Bound the full gradients (stage 1: the chunks) alive at once: finish the oldest reduction
    // before going on.
    in_flight_.push_back(b);
    while (in_flight_.size() > options_.max_in_flight) {
      complete(in_flight_.front());
      in_flight_.pop_front();
    }
  }
}

// Note [Stage 1 reduce-scatters]
// Stage 1 keeps each bucket's full gradient (each gradient goes into its rows, no_sync backwards
// accumulating), but after the reduction only this rank's rows are read: the optimizer steps this
// rank's shards, and the next all-gather brings every other row from its owner. So the full
// gradient is reduce-scattered, not all-reduced: each rank sends and receives (W-1)/W of it rather
// than twice that, as DeepSpeed's ZeRO-1 reduce-scatters; until 2026-12-06 an all-reduce made
// ZeRO-1's step 1.3-1.4x ZeRO-2's at 4 ranks on the CPU (docs/benchmarks.md). Our ring (Gloo) sums
// into this rank's chunk using the other rows as its scratch (they hold partial sums afterwards;
// over NCCL, which reduces a packed copy, they keep this rank's own gradient); nothing reads them:
// the guard stands in every full .grad until the next backward overwrites them (or, for a local
// one, the next forward zeroes them: bind_full_grad).
// The chunk is written back into this rank's rows, whose views are the shards' gradients, so in the
// parameters' dtype the steady state holds nothing beyond the full gradient (with a reduce dtype of
// its own, the shards' gradients are the chunk, Ψ/N more). The chunk lives while the reduction is
// in flight, and `max_in_flight` bounds those as it bounds stage 2's full gradients.

// Note [Nothing to reduce-scatter alone]
// Stages 2 and 3 in a shard group of one rank, without replicas: the average over the group is
// each gradient itself, and this rank's chunk is all of it. Reduce-scattering would copy every
// gradient into a chunk of the unit's size (the gradients' memory twice, for a moment) and make
// the shards' gradients views of it. Instead each shard's gradient is the one autograd made (cast
// to the reduce dtype, as the wire would have carried it, then to the shard's), the same values.
// DDP does the same at one rank (ddp/reducer.cpp); the parameters' side is fsdp_core.cpp's Note
// [Nothing to shard alone].

// Waits for bucket b's reduction and hands its result to the shards' gradients.
void GradientSync::complete(std::size_t b) {
  BucketState& state = states_[b];
  if (state.completed) return;
  state.completed = true;
  // Gradient memory only grows between completions (gradients collected, chunks made), and each
  // completion frees some: its start is where a peak is, measured once a bucket rather than once
  // a parameter.
  note_gradient_bytes();
  state.work.wait();
  // What the wire work held (over NCCL, a packed copy of the unit's gradients) goes now, not at
  // the next forward.
  state.work = Work();
  ParamBucket& bucket = buckets_[b];
  state.reduced = true;
  if (!options_.shard_gradients) {
    complete_full_gradient(b);
    return;
  }
  if (state.alone) {
    accumulate_shard_grads_alone(bucket, state.grads, reduce_dtype_of(b), state.division);
    drop_held_gradients(state);
    return;
  }
  // See Note [HSDP gradient reduction].
  if (replicate_ && !average_across_replicas(state, state.chunk)) {
    drop_held_gradients(state);
    return;
  }
  if (state.hook) state.hook(state.chunk);
  scale_after_reduction(state.division, state.chunk);
  const bool kept = shard_grads_defined(bucket);
  accumulate_shard_grads_from_chunk(bucket, state.chunk);
  // Added into kept gradients, the chunk is needed no more: keeping it would hold a second one
  // beside the chunk they are views of (Note [Shard gradients accumulate]).
  if (kept && !shard_grads_alias(bucket, state.chunk)) state.chunk = at::Tensor();
  // Stages 2 and 3 keep only the shards' gradients: the full ones go until the next backward.
  drop_held_gradients(state);
}

// Stage 1: this rank's rows of the reduced gradient (in the chunk; alone in the shard group, in
// the wire itself) to the shards' gradients.
void GradientSync::complete_full_gradient(std::size_t b) {
  BucketState& state = states_[b];
  ParamBucket& bucket = buckets_[b];
  const bool in_place = state.wire.is_same(state.full_grad);
  if (!state.chunk.defined() && !replicate_ && !state.hook) {
    // Alone: the wire is the reduction; the shards' gradients are views of its rows.
    scale_after_reduction(state.division, state.wire);
    accumulate_shard_grads_from_unsharded(bucket, state.wire);
  } else {
    at::Tensor mine = state.chunk.defined() ? std::exchange(state.chunk, at::Tensor()) : rank_chunk(bucket, state.wire);
    // Note [HSDP gradient reduction]
    // The shard group has averaged its ranks' gradients; the replicas, each another slice of the
    // batch, now average the part this rank keeps: Ψ/S elements cross the replicate dimension,
    // not Ψ. Synchronous, in the order every rank completes its buckets (see Note [FSDP reduction
    // order]).
    if (!replicate_ || average_across_replicas(state, mine)) {
      if (state.hook) state.hook(mine);
      scale_after_reduction(state.division, mine);
      if (in_place) {
        write_rank_chunk(bucket, mine, state.full_grad);
        accumulate_shard_grads_from_unsharded(bucket, state.full_grad);
      } else {
        accumulate_shard_grads_from_chunk(bucket, mine);  // in the reduce dtype, as the wire carried it
      }
    }
  }
  if (!in_place) state.wire = at::Tensor();
}

// Note [HSDP all-reduce skipped]
// set_requires_all_reduce(false), as FSDP2's (_fsdp_collectives.py, foreach_reduce with
// all_reduce_grads false): the shard group's reduction still runs each synchronized backward, but
// its result, this rank's rows averaged over the shard group only, is summed into `set_aside`
// rather than all-reduced across the replicas; the shards' gradients stay as they were. The next
// backward that all-reduces adds it to its own rows first, so one all-reduce averages them all:
// the replicas then hold what a synchronized backward for each would have given. Until then
// `set_aside` differs between replicas (each saw other samples), and the optimizer must not step.
bool GradientSync::average_across_replicas(BucketState& state, at::Tensor& mine) {
  if (!all_reduce_) {
    if (state.set_aside.defined()) {
      state.set_aside.add_(mine);
    } else {
      state.set_aside = std::exchange(mine, at::Tensor());  // a fresh chunk is made next time
    }
    return false;
  }
  if (state.set_aside.defined()) mine.add_(std::exchange(state.set_aside, at::Tensor()));
  all_reduce(*replicate_, mine, state.division.replicate_op);
  return true;
}

void GradientSync::finish_backward() {
  std::function<void(bool)> backward_end;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (mode_ != Mode::kSync) return;
    // Parameters that got no gradient contribute zeros (stage 1: put in their place at launch).
    for (std::size_t b = 0; b < states_.size(); ++b) {
      if (options_.shard_gradients) {
        for (std::size_t i = 0; i < buckets_[b].params().size(); ++i) collect(b, i);
      }
      if (states_[b].pending != 0 && bucket_done_) bucket_done_(b);
      states_[b].pending = 0;
    }
    launch_ready_buckets();
    for (std::size_t b = 0; b < buckets_.size(); ++b) complete(b);
    in_flight_.clear();
    mode_ = Mode::kFinished;
    shards_stepped_ = true;
    full_grad_guard_->arm();
    backward_end = backward_end_;
  }
  if (backward_end) backward_end(true);
}

// Note [Local backward again]
// A local backward's graph may be run again (retain_graph): autograd's second pass uses the saved
// weights, so stage 3 gathers their units again, and must release them as the first pass did
// (FSDP2's post-backward hooks run again and reshard each group). So the end of a local backward
// readies the next one as prepare() would: the counts per bucket start again (each unit released
// once its gradients are in) and the next pass queues its own end (everything released). Before
// 2026-12-05 a second pass queued no end and its units stayed gathered until the next forward.
// A synchronized backward's graph cannot run again: its gradients were reduced (an error above).
void GradientSync::finish_local_backward() {
  std::function<void(bool)> backward_end;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (mode_ != Mode::kNoSync) return;
    finish_queued_ = false;
    for (std::size_t b = 0; b < states_.size(); ++b) states_[b].pending = buckets_[b].params().size();
    backward_end = backward_end_;
  }
  if (backward_end) backward_end(false);
}

void GradientSync::finalize() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    TORCH_CHECK(mode_ != Mode::kSync, "cpprun::FullyShardedDataParallel::finalize_backward: a forward prepared a "
                "synchronized backward; turn manual finalization on before the step's first forward.");
    clear_reductions();
    prepared_ = false;
    mode_ = Mode::kSync;  // finish_backward() collects every gradient (stage 1: in full_grad already)
  }
  finish_backward();
}

bool GradientSync::shards_stepped() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return shards_stepped_;
}

bool GradientSync::take_shards_stepped() {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::exchange(shards_stepped_, false);
}

int64_t GradientSync::gradient_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return held_gradient_bytes();
}

// Each storage once: the shards' gradients are views of the full gradient (stage 1) or of the
// chunk (stages 2 and 3), or their own tensors (alone; mixed precision's and offload's copies;
// gradients kept between steps, Note [Shard gradients accumulate]).
int64_t GradientSync::held_gradient_bytes() const {
  std::unordered_set<const c10::StorageImpl*> counted;
  int64_t bytes = 0;
  auto count = [&](const at::Tensor& t) {
    if (!t.defined() || !t.has_storage()) return;
    if (counted.insert(t.storage().unsafeGetStorageImpl()).second) bytes += static_cast<int64_t>(t.storage().nbytes());
  };
  for (std::size_t b = 0; b < states_.size(); ++b) {
    const BucketState& state = states_[b];
    count(state.full_grad);
    count(state.chunk);
    count(state.set_aside);
    for (const auto& grad : state.grads) count(grad);
    for (const auto& s : buckets_[b].params()) count(s.shard.grad());
  }
  return bytes;
}

void GradientSync::note_gradient_bytes() { peak_bytes_ = std::max(peak_bytes_, held_gradient_bytes()); }

int64_t GradientSync::peak_gradient_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::max(peak_bytes_, held_gradient_bytes());
}

}  // namespace cpprun::detail
