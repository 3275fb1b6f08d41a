// See parameter_residency.h.
#include "fsdp/parameter_residency.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <utility>

#include "fsdp/fsdp_collectives.h"
#include "fsdp/full_parameter_writes.h"

namespace cpprun::detail {
namespace {
bool contains(const std::vector<std::size_t>& v, std::size_t x) { return std::find(v.begin(), v.end(), x) != v.end(); }
}  // namespace

ParameterResidency::ParameterResidency(std::vector<ParamBucket>& buckets, std::size_t unit_count,
                                       std::size_t root_unit, ProcessGroup group, ResidencyOptions options)
    : buckets_(buckets), root_unit_(root_unit), group_(std::move(group)), options_(options), states_(unit_count) {
  TORCH_INTERNAL_ASSERT(options_.limit >= 1);  // FsdpCore checks the user's option
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    ParamBucket& bucket = buckets_[b];
    states_[bucket.unit()].buckets.push_back(b);
    if (!bucket.frozen()) ++states_[bucket.unit()].trainable_buckets;
    if (bucket.unsharded_allocated()) bucket.release_unsharded();
    std::vector<at::Tensor> params;
    for (const auto& s : bucket.params()) params.push_back(s.param);
    watch_uses(bucket.unsharded(), params, *this, bucket.unit());
  }
}

ParameterResidency::~ParameterResidency() {
  for (auto& bucket : buckets_) {
    std::vector<at::Tensor> params;
    for (const auto& s : bucket.params()) params.push_back(s.param);
    unwatch_uses(bucket.unsharded(), params);
  }
  for (auto& state : states_) {
    for (auto& work : state.in_flight) work.wait();
  }
}

void ParameterResidency::before_use(const std::vector<std::size_t>& needed) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (std::size_t u : needed) use(u, needed);
}

std::size_t ParameterResidency::bucket_over(std::size_t u, const at::Tensor& written) const {
  const c10::StorageImpl* storage = written.storage().unsafeGetStorageImpl();
  for (std::size_t b : states_[u].buckets) {
    if (buckets_[b].unsharded().storage().unsafeGetStorageImpl() == storage) return b;
  }
  return buckets_.size();  // moved off it (set_data): nothing of the unit's to write back
}

// See Note [In-place writes to full parameters] in full_parameter_writes.cpp.
void ParameterResidency::before_write(std::size_t u, const at::Tensor& written, const c10::OperatorName& op) {
  std::lock_guard<std::mutex> lock(mutex_);
  const std::size_t b = bucket_over(u, written);
  if (b == buckets_.size()) return;
  const ParamBucket& bucket = buckets_[b];
  for (std::size_t i : params_written(bucket, written)) {
    if (bucket.params()[i].shard.scalar_type() == bucket.unsharded().scalar_type()) continue;
    refuse_write_to_compute_copy(bucket, i, op.name, group_.rank());
  }
}

void ParameterResidency::after_write(std::size_t u, const at::Tensor& written) {
  std::lock_guard<std::mutex> lock(mutex_);
  const std::size_t b = bucket_over(u, written);
  if (b == buckets_.size()) return;
  ParamBucket& bucket = buckets_[b];
  for (std::size_t i : params_written(bucket, written)) write_back_rows(bucket, i);
  // The shards changed to what the gathered unit holds: it stays current.
  states_[u].shard_version = shard_version(u);
}

void ParameterResidency::use(std::size_t u, const std::vector<std::size_t>& needed) {
  UnitState& state = states_[u];
  // Backward has reached another unit: those with frozen parameters that it finished are through.
  if (phase_ == Phase::kBackward && !state.used_this_phase) release_finished_frozen_units(u, needed);
  if (state.gathered && stale(u)) release(u);  // the optimizer stepped since
  if (!state.gathered) gather(u, needed);
  complete(u);
  if (std::exchange(state.prefetched, false)) ++prefetches_used_;
  state.last_use = ++clock_;
  if (state.used_this_phase) return;
  state.used_this_phase = true;
  if (phase_ == Phase::kForward) this_order_.push_back(u);
  if (options_.prefetch && phase_ != Phase::kIdle) prefetch_neighbour(u, needed);
}

// The unit the model used right after u in the last forward (before it, in backward).
void ParameterResidency::prefetch_neighbour(std::size_t u, const std::vector<std::size_t>& keep) {
  auto at = std::find(order_.begin(), order_.end(), u);
  if (at == order_.end()) return;
  std::size_t next;
  if (phase_ == Phase::kForward) {
    if (at + 1 == order_.end()) return;
    next = *(at + 1);
  } else {
    if (at == order_.begin()) return;
    next = *(at - 1);
  }
  UnitState& state = states_[next];
  if (state.gathered || state.done || contains(keep, next)) return;
  // A unit of frozen parameters only is not gathered ahead in backward: no gradient of its own
  // needs it, and whether the backward reaches it at all (frozen embeddings at the input do not
  // carry it) is unknown; where it does, it is gathered on use.
  if (phase_ == Phase::kBackward && state.trainable_buckets == 0) return;
  // Only into free room, or room an idle one gives up: never at the expense of one in use.
  std::vector<std::size_t> protect = keep;
  protect.push_back(u);
  protect.push_back(next);
  make_room(protect);
  if (static_cast<int>(gathered_count()) >= options_.limit) return;
  gather(next, protect);  // completes asynchronously; use() waits for it
  ++prefetches_;
  state.prefetched = true;
  state.last_use = ++clock_;  // as if used now: LRU must not evict it before its use comes
}

void ParameterResidency::gather(std::size_t u, const std::vector<std::size_t>& keep) {
  make_room(keep);
  start_gather(u);
  note_peak();
}

// Gathered and kept.
void ParameterResidency::note_peak() { peak_bytes_ = std::max(peak_bytes_, gathered_bytes() + spare_bytes()); }

c10::DataPtr ParameterResidency::take_spare(std::size_t bytes) {
  for (auto it = spares_.begin(); it != spares_.end(); ++it) {
    if (it->bytes == bytes) {
      c10::DataPtr memory = std::move(it->memory);
      spares_.erase(it);
      return memory;
    }
  }
  // No spare fits: drop one if keeping it would take the total past the limit.
  if (!spares_.empty() && static_cast<int>(gathered_count() + spares_.size()) >= options_.limit) {
    spares_.erase(spares_.begin());
  }
  return c10::DataPtr();
}

void ParameterResidency::keep_spare(std::size_t bytes, c10::DataPtr memory) {
  // In backward, the unit's gradients come next and need as much memory: the allocator takes
  // it back for them rather than it waiting here for the next gather (see the header).
  if (phase_ == Phase::kBackward) return;
  if (static_cast<int>(gathered_count() + spares_.size()) < options_.limit) spares_.push_back({bytes, std::move(memory)});
}

void ParameterResidency::start_gather(std::size_t u) {
  UnitState& state = states_[u];
  state.shard_version = shard_version(u);
  state.epoch = epoch_;
  // The unit's buckets of one dtype and device (its trainable and frozen parameters) travel as one
  // all-gather.
  std::vector<std::vector<std::pair<const ParamBucket*, at::Tensor>>> by_wire;
  for (std::size_t b : state.buckets) {
    ParamBucket& bucket = buckets_[b];
    bucket.allocate_unsharded(take_spare(bucket.unsharded_bytes()));
    const at::Tensor& into = bucket.unsharded();
    auto same = std::find_if(by_wire.begin(), by_wire.end(), [&](const auto& gather) {
      const at::Tensor& other = gather.front().second;
      return other.scalar_type() == into.scalar_type() && other.device() == into.device();
    });
    if (same == by_wire.end()) same = by_wire.emplace(by_wire.end());
    same->emplace_back(&bucket, into);
  }
  for (const auto& gather : by_wire) state.in_flight.push_back(all_gather_shards(group_, gather));
  state.gathered = true;
}

void ParameterResidency::complete(std::size_t u) {
  UnitState& state = states_[u];
  for (auto& work : state.in_flight) work.wait();
  state.in_flight.clear();
}

void ParameterResidency::release(std::size_t u) {
  UnitState& state = states_[u];
  if (!state.gathered) return;
  complete(u);
  state.prefetched = false;
  state.gathered = false;
  for (std::size_t b : state.buckets) {
    const std::size_t bytes = buckets_[b].unsharded_bytes();
    keep_spare(bytes, buckets_[b].release_unsharded());
  }
}

// Releases the least recently used gathered units, other than `keep`, until one more fits.
void ParameterResidency::make_room(const std::vector<std::size_t>& keep) {
  while (static_cast<int>(gathered_count()) >= options_.limit) {
    std::size_t victim = states_.size();
    for (std::size_t v = 0; v < states_.size(); ++v) {
      if (!states_[v].gathered || contains(keep, v)) continue;
      if (victim == states_.size() || states_[v].last_use < states_[victim].last_use) victim = v;
    }
    if (victim == states_.size()) return;  // everything gathered is in use: exceed the limit
    release(victim);
  }
}

// Note [Stale gathered units]
// A unit kept gathered (unshard(), reshard_after_backward or reshard_after_forward off) is used by
// a forward only if its shards cannot have changed since it was gathered. LibTorch's optimizers
// step through .data(), which has a version counter of its own, so the shards' versions do not
// show their steps. Like stages 1 and 2, which all-gather after each synchronized backward
// (take_shards_stepped), we take the optimizer to step between a synchronized backward's end and
// the next forward (the step window): what was gathered before that window ends, during it
// included (an unshard() may come before the step), is stale from the next forward on, and
// from the next unshard() in the window; so is what was gathered before a load. (Stages 1 and 2
// likewise: gather_full_parameters() in the window gathers and leaves the window open.) A local
// backward (no_sync, set_requires_gradient_sync(false)) opens no window: what it kept stays
// current, which is what reshard_after_backward off is for. Only a forward with autograd ends the
// window: an evaluation forward in it (between backward and step, or after the step and before
// the next training forward) gathers anew and leaves it open, as it cannot tell whether the step
// came; outside the window, evaluation forwards keep what they gathered (reshard_after_forward
// off). The versions still catch in-place writes that count.
// The cost: what such an evaluation keeps, the next training forward gathers again, one all-gather
// more than FSDP2 (right to reuse them only if the evaluation came after the step; before it, it
// computes with the old parameters). With reshard_after_forward on (the default) the evaluation
// keeps nothing and costs FSDP2's gathers exactly. Telling the two orders apart would need a copy
// of the shards from the evaluation's gather, compared bit for bit at the training forward and the
// verdict agreed by an all-reduce: Ψ/N memory and a collective for one all-gather saved in one of
// the two orders; not done (docs/fsdp.md, "What an evaluation forward costs after the step").
bool ParameterResidency::stale(std::size_t u) const {
  return states_[u].epoch != epoch_ || shard_version(u) != states_[u].shard_version;
}

// Units past their epoch are stale on every rank alike; a unit whose shards were written is
// stale where they were, so that verdict is agreed first (Note [Shard writes seen on one rank]
// in fsdp_collectives.cpp), and only where some gathered unit is still of this epoch.
void ParameterResidency::release_stale_units() {
  std::vector<std::size_t> current;
  for (std::size_t u = 0; u < states_.size(); ++u) {
    if (!states_[u].gathered) continue;
    if (states_[u].epoch != epoch_) {
      release(u);
    } else {
      current.push_back(u);
    }
  }
  std::vector<bool> written(current.size());
  for (std::size_t i = 0; i < current.size(); ++i) written[i] = shard_version(current[i]) != states_[current[i]].shard_version;
  written = changed_on_any_rank(group_, written);
  for (std::size_t i = 0; i < current.size(); ++i) {
    if (written[i]) release(current[i]);
  }
}

int64_t ParameterResidency::shard_version(std::size_t u) const {
  int64_t sum = 0;
  for (std::size_t b : states_[u].buckets) {
    for (const auto& s : buckets_[b].params()) sum += static_cast<int64_t>(s.shard._version());
  }
  return sum;
}

std::size_t ParameterResidency::gathered_count() const {
  return static_cast<std::size_t>(std::count_if(states_.begin(), states_.end(), [](const UnitState& s) { return s.gathered; }));
}

void ParameterResidency::begin_forward(bool ends_window) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (step_window_) ++epoch_;  // See Note [Stale gathered units]
  if (ends_window) step_window_ = false;
  release_stale_units();
  start_forward_phase();
}

void ParameterResidency::continue_forward() {
  std::lock_guard<std::mutex> lock(mutex_);
  start_forward_phase();
}

void ParameterResidency::start_forward_phase() {
  for (auto& state : states_) {
    state.used_this_phase = false;
    state.done = false;
    state.buckets_done = 0;
  }
  this_order_.clear();
  phase_ = Phase::kForward;
}

void ParameterResidency::end_forward(bool backward_follows) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (phase_ == Phase::kForward) order_ = this_order_;
  // Backward starts with the unit forward used last: releasing it only to gather it again at
  // once would cost a gather and save nothing.
  std::size_t last = states_.size();
  for (std::size_t u = 0; u < states_.size(); ++u) {
    if (states_[u].gathered && u != root_unit_ && (last == states_.size() || states_[u].last_use > states_[last].last_use)) {
      last = u;
    }
  }
  phase_ = backward_follows ? Phase::kBackward : Phase::kIdle;
  for (std::size_t u = 0; u < states_.size(); ++u) {
    // reshard_after_forward off keeps them after a forward without backward too (FSDP2's use: a
    // run of evaluation forwards gathers once).
    const bool keep = !options_.reshard_after_forward || (backward_follows && (u == root_unit_ || u == last));
    if (!keep) release(u);
    states_[u].used_this_phase = false;
  }
  // Backward keeps no released memory (see keep_spare) but for one unit's, for its first gather.
  if (backward_follows && spares_.size() > 1) spares_.resize(1);
}

void ParameterResidency::backward_done(std::size_t bucket) {
  std::lock_guard<std::mutex> lock(mutex_);
  // A second pass of a local backward (retain_graph) comes after end_backward(): it is backward
  // again (released memory goes back to the allocator, see keep_spare).
  phase_ = Phase::kBackward;
  UnitState& state = states_[buckets_[bucket].unit()];
  if (++state.buckets_done < state.trainable_buckets) return;
  state.done = true;
  // A unit with frozen parameters may still be needed: its trainable parameters' gradients can
  // all be in before backward is through its frozen ones (LoRA's adapters' before the base
  // weight's input gradient), and releasing it then gathered it again at once (an audit,
  // 2026-12-07: 3 units' all-gathers more a step). It goes when backward first uses another unit
  // (release_finished_frozen_units), as room is needed, or at backward's end: FSDP2 reshards a
  // module once its inputs' gradients are made, which is when backward moves on.
  if (state.trainable_buckets < state.buckets.size()) return;
  if (options_.reshard_after_backward) release(buckets_[bucket].unit());
}

void ParameterResidency::release_finished_frozen_units(std::size_t next, const std::vector<std::size_t>& keep) {
  if (!options_.reshard_after_backward) return;
  for (std::size_t v = 0; v < states_.size(); ++v) {
    const UnitState& state = states_[v];
    if (v == next || !state.gathered || !state.done || state.trainable_buckets == state.buckets.size()) continue;
    if (!contains(keep, v)) release(v);
  }
}

void ParameterResidency::end_backward(bool reduced) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (reduced) {  // See Note [Stale gathered units]
    ++epoch_;
    step_window_ = true;
  }
  phase_ = Phase::kBackward;  // a second pass's may have ended idle: released memory is not kept
  if (options_.reshard_after_backward) {
    for (std::size_t u = 0; u < states_.size(); ++u) release(u);
  }
  phase_ = Phase::kIdle;
}

void ParameterResidency::shards_replaced() {
  std::lock_guard<std::mutex> lock(mutex_);
  ++epoch_;
}

void ParameterResidency::release_all() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (std::size_t u = 0; u < states_.size(); ++u) release(u);
  spares_.clear();
}

void ParameterResidency::set_reshard_after_forward(bool on) {
  std::lock_guard<std::mutex> lock(mutex_);
  options_.reshard_after_forward = on;
}

void ParameterResidency::set_reshard_after_backward(bool on) {
  std::lock_guard<std::mutex> lock(mutex_);
  options_.reshard_after_backward = on;
}

void ParameterResidency::gather_all() {
  std::lock_guard<std::mutex> lock(mutex_);
  // In the step window an earlier gather_all() may predate the step: gather everything anew
  // (Note [Stale gathered units]).
  if (step_window_) ++epoch_;
  phase_ = Phase::kIdle;
  release_stale_units();
  for (std::size_t u = 0; u < states_.size(); ++u) {
    if (!states_[u].gathered) start_gather(u);
    note_peak();
    complete(u);  // one at a time
  }
}

int64_t ParameterResidency::gathered_bytes() const {
  int64_t bytes = 0;
  for (const auto& bucket : buckets_) bytes += static_cast<int64_t>(bucket.unsharded().storage().nbytes());
  return bytes;
}

int64_t ParameterResidency::spare_bytes() const {
  int64_t bytes = 0;
  for (const auto& spare : spares_) bytes += static_cast<int64_t>(spare.bytes);
  return bytes;
}

int64_t ParameterResidency::kept_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return spare_bytes();
}

void ParameterResidency::prefetch_stats(int64_t& started, int64_t& used) const {
  std::lock_guard<std::mutex> lock(mutex_);
  started = prefetches_;
  used = prefetches_used_;
}

int64_t ParameterResidency::peak_gathered_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return peak_bytes_;
}

}  // namespace cpprun::detail
