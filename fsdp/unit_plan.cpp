// See unit_plan.h. Post-order, as PyTorch's size_based_auto_wrap_policy: a child becomes a unit
// when the policy selects it or when the parameters it holds outside smaller units reach the
// minimum; otherwise its parameters stay with its parent.
#include "fsdp/unit_plan.h"

#include <c10/util/Exception.h>

#include <unordered_map>

namespace cpprun::detail {
namespace {

int64_t count(const UnitPlan& plan) {
  int64_t n = 0;
  for (const auto& p : plan.params) n += p.numel();
  return n;
}

// Returns the parameters of `module`'s subtree that no unit took.
UnitPlan plan_subtree(torch::nn::Module& module, const std::string& prefix, const FsdpOptions& options,
                      std::vector<UnitPlan>& units) {
  UnitPlan rest;
  rest.name = prefix;
  for (const auto& item : module.named_parameters(/*recurse=*/false)) {
    if (!item.value().requires_grad()) continue;
    rest.param_names.push_back(prefix.empty() ? item.key() : prefix + "." + item.key());
    rest.params.push_back(item.value());
  }
  for (const auto& child : module.named_children()) {
    const std::string name = prefix.empty() ? child.key() : prefix + "." + child.key();
    UnitPlan sub = plan_subtree(*child.value(), name, options, units);
    if (sub.params.empty()) continue;
    const bool by_type = options.wrap_policy() && options.wrap_policy()(*child.value());
    const bool by_size = options.auto_wrap_min_params() > 0 && count(sub) >= options.auto_wrap_min_params();
    if (by_type || by_size) {
      units.push_back(std::move(sub));
    } else {
      rest.param_names.insert(rest.param_names.end(), sub.param_names.begin(), sub.param_names.end());
      rest.params.insert(rest.params.end(), sub.params.begin(), sub.params.end());
    }
  }
  return rest;
}

// Every parameter must belong to exactly one unit: a flat parameter owns its storage.
void check_not_shared(const std::vector<UnitPlan>& units) {
  std::unordered_map<const void*, std::string> owner;
  for (const auto& unit : units) {
    for (std::size_t i = 0; i < unit.params.size(); ++i) {
      auto [it, fresh] = owner.emplace(unit.params[i].unsafeGetTensorImpl(), unit.param_names[i]);
      TORCH_CHECK(fresh, "cpprun::FullyShardedDataParallel: parameter \"", unit.param_names[i], "\" is the same tensor as \"",
                  it->second, "\" (a shared or tied parameter). Each parameter must belong to one unit; tie them in "
                  "forward instead, or keep both modules in one unit (adjust wrap_policy / auto_wrap_min_params).");
    }
  }
}

}  // namespace

std::vector<UnitPlan> plan_units(torch::nn::Module& root, const FsdpOptions& options) {
  std::vector<UnitPlan> units;
  UnitPlan rest = plan_subtree(root, "", options, units);
  if (!rest.params.empty()) units.push_back(std::move(rest));
  TORCH_CHECK(!units.empty(), "cpprun::FullyShardedDataParallel: the module has no parameter that requires grad.");
  check_not_shared(units);
  return units;
}

}  // namespace cpprun::detail
