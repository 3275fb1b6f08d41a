// See parameter_residency.h.
#include "fsdp/parameter_residency.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <utility>

namespace cpprun::detail {
namespace {
bool contains(const std::vector<std::size_t>& v, std::size_t x) { return std::find(v.begin(), v.end(), x) != v.end(); }
}  // namespace

ParameterResidency::ParameterResidency(std::vector<FlatParam>& flats, std::vector<bool> root, ProcessGroup group,
                                       ResidencyOptions options)
    : flats_(flats), root_(std::move(root)), group_(std::move(group)), options_(options), states_(flats.size()) {
  TORCH_INTERNAL_ASSERT(options_.limit >= 1);  // FsdpCore checks the user's option
  for (std::size_t u = 0; u < flats_.size(); ++u) {
    flats_[u].release_full();
    watch_uses(flats_[u].full(), flats_[u].params(), *this, u);
  }
}

ParameterResidency::~ParameterResidency() {
  for (std::size_t u = 0; u < flats_.size(); ++u) {
    unwatch_uses(flats_[u].full(), flats_[u].params());
    states_[u].in_flight.wait();
  }
}

void ParameterResidency::before_use(const std::vector<std::size_t>& needed) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (std::size_t u : needed) use(u, needed);
}

void ParameterResidency::use(std::size_t u, const std::vector<std::size_t>& needed) {
  FlatState& state = states_[u];
  if (state.gathered && stale(u)) release(u);  // the optimizer stepped its shard since the gather
  if (!state.gathered) gather(u, needed);
  complete(u);
  if (std::exchange(state.prefetched, false)) ++prefetches_used_;
  state.last_use = ++clock_;
  if (state.used_this_phase) return;
  state.used_this_phase = true;
  if (phase_ == Phase::kForward) this_order_.push_back(u);
  if (options_.prefetch && phase_ != Phase::kIdle) prefetch_neighbour(u, needed);
}

// The flat parameter the model used right after u in the last forward (before it, in backward).
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
  FlatState& state = states_[next];
  if (state.gathered || state.done || contains(keep, next)) return;
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
  peak_bytes_ = std::max(peak_bytes_, gathered_bytes() + spare_bytes());
}

void ParameterResidency::start_gather(std::size_t u) {
  FlatParam& flat = flats_[u];
  FlatState& state = states_[u];
  c10::DataPtr reuse;
  for (auto it = spares_.begin(); it != spares_.end(); ++it) {
    if (it->bytes == flat.full_bytes()) {
      reuse = std::move(it->memory);
      spares_.erase(it);
      break;
    }
  }
  // No spare fits: drop one if keeping it would take the total past the limit.
  if (!reuse && !spares_.empty() && static_cast<int>(gathered_count() + spares_.size()) >= options_.limit) {
    spares_.erase(spares_.begin());
  }
  flat.allocate_full(std::move(reuse));
  // To the model's device (CPU offload) and compute dtype (mixed precision), where they differ.
  state.send = flat.shard().detach().to(flat.full().device(), flat.full().scalar_type(), /*non_blocking=*/true);
  state.shard_version = flat.shard()._version();
  state.in_flight = all_gather_into_async(group_, flat.full(), state.send);
  state.gathered = true;
}

void ParameterResidency::complete(std::size_t u) {
  FlatState& state = states_[u];
  state.in_flight.wait();
  state.in_flight = Work();
  state.send = at::Tensor();
}

void ParameterResidency::release(std::size_t u) {
  FlatState& state = states_[u];
  if (!state.gathered) return;
  complete(u);
  state.prefetched = false;
  const std::size_t bytes = flats_[u].full_bytes();
  c10::DataPtr memory = flats_[u].release_full();
  state.gathered = false;
  if (static_cast<int>(gathered_count() + spares_.size()) < options_.limit) spares_.push_back({bytes, std::move(memory)});
}

// Releases the least recently used gathered flat parameters, other than `keep`, until one more fits.
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

bool ParameterResidency::stale(std::size_t u) const {
  return flats_[u].shard()._version() != states_[u].shard_version;
}

std::size_t ParameterResidency::gathered_count() const {
  return static_cast<std::size_t>(std::count_if(states_.begin(), states_.end(), [](const FlatState& s) { return s.gathered; }));
}

void ParameterResidency::begin_forward() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (std::size_t u = 0; u < states_.size(); ++u) {
    release(u);
    states_[u].used_this_phase = false;
    states_[u].done = false;
  }
  this_order_.clear();
  phase_ = Phase::kForward;
}

void ParameterResidency::end_forward(bool backward_follows) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (phase_ == Phase::kForward) order_ = this_order_;
  // Backward starts with the flat parameter forward used last: releasing it only to gather it again at
  // once would cost a gather and save nothing.
  std::size_t last = states_.size();
  for (std::size_t u = 0; u < states_.size(); ++u) {
    if (states_[u].gathered && !root_[u] && (last == states_.size() || states_[u].last_use > states_[last].last_use)) last = u;
  }
  for (std::size_t u = 0; u < states_.size(); ++u) {
    const bool keep = backward_follows && (root_[u] || u == last || !options_.reshard_after_forward);
    if (!keep) release(u);
    states_[u].used_this_phase = false;
  }
  phase_ = backward_follows ? Phase::kBackward : Phase::kIdle;
}

void ParameterResidency::backward_done(std::size_t u) {
  std::lock_guard<std::mutex> lock(mutex_);
  states_[u].done = true;
  release(u);
}

void ParameterResidency::end_backward() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (std::size_t u = 0; u < states_.size(); ++u) release(u);
  phase_ = Phase::kIdle;
}

void ParameterResidency::gather_all() {
  std::lock_guard<std::mutex> lock(mutex_);
  phase_ = Phase::kIdle;
  for (std::size_t u = 0; u < states_.size(); ++u) {
    if (states_[u].gathered && stale(u)) release(u);
    if (!states_[u].gathered) start_gather(u);
  }
  for (std::size_t u = 0; u < states_.size(); ++u) complete(u);
  peak_bytes_ = std::max(peak_bytes_, gathered_bytes() + spare_bytes());
}

void ParameterResidency::release_all() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (std::size_t u = 0; u < states_.size(); ++u) release(u);
}

int64_t ParameterResidency::gathered_bytes() const {
  int64_t bytes = 0;
  for (const auto& flat : flats_) bytes += static_cast<int64_t>(flat.full().storage().nbytes());
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
