// See deferred_units.h.
#include "fsdp/deferred_units.h"

#include <unordered_set>

#include "cpprun/collectives.h"
#include "cpprun/deferred_init.h"

namespace cpprun::detail {

bool has_deferred_state(torch::nn::Module& module) {
  for (const auto& p : module.parameters()) {
    if (is_deferred(p)) return true;
  }
  for (const auto& b : module.buffers()) {
    if (is_deferred(b)) return true;
  }
  return false;
}

DeferredUnits::DeferredUnits(torch::nn::Module& module, const std::vector<UnitPlan>& units, ProcessGroup group)
    : group_(std::move(group)) {
  std::unordered_set<const c10::TensorImpl*> in_units;
  for (const auto& unit : units) {
    units_.push_back(unit.params);
    for (const auto& p : unit.params) in_units.insert(p.unsafeGetTensorImpl());
  }
  for (const auto& p : module.parameters()) {
    if (!in_units.count(p.unsafeGetTensorImpl())) rest_.push_back(p);
  }
  for (const auto& b : module.buffers()) rest_.push_back(b);
  std::vector<std::vector<at::Tensor>> groups{rest_};
  groups.insert(groups.end(), units_.begin(), units_.end());
  replay_ = std::make_unique<DeferredReplay>(groups);
}

void DeferredUnits::materialize_rest() {
  replay_->materialize(0);
  if (!rest_.empty()) broadcast_coalesced(group_, rest_, 0);
  rest_.clear();
}

void DeferredUnits::materialize_unit(std::size_t u) {
  replay_->materialize(u + 1);
  broadcast_coalesced(group_, units_[u], 0);
  units_[u].clear();  // sharding moves them into the bucket's memory: hold no reference
}

}  // namespace cpprun::detail
