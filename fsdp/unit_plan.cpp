// See unit_plan.h. Post-order, as PyTorch's size_based_auto_wrap_policy: a child becomes a unit
// when the policy selects it or when the parameters it holds outside smaller units reach the
// minimum; otherwise its parameters stay with its parent. A tensor registered under several names
// (tied, e.g. an embedding and the output layer) is planned once, where the walk meets it first.
#include "fsdp/unit_plan.h"

#include <unordered_set>

namespace cpprun::detail {
namespace {

int64_t count(const UnitPlan& plan) {
  int64_t n = 0;
  for (const auto& p : plan.params) n += p.numel();
  return n;
}

// Returns the parameters of `module`'s subtree that no unit took.
UnitPlan plan_subtree(torch::nn::Module& module, const std::string& prefix, const FsdpOptions& options,
                      std::vector<UnitPlan>& units, std::unordered_set<const c10::TensorImpl*>& planned) {
  UnitPlan rest;
  rest.name = prefix;
  for (const auto& item : module.named_parameters(/*recurse=*/false)) {
    if (!item.value().requires_grad()) continue;
    if (!planned.insert(item.value().unsafeGetTensorImpl()).second) continue;  // tied: planned already
    rest.param_names.push_back(prefix.empty() ? item.key() : prefix + "." + item.key());
    rest.params.push_back(item.value());
  }
  for (const auto& child : module.named_children()) {
    const std::string name = prefix.empty() ? child.key() : prefix + "." + child.key();
    UnitPlan sub = plan_subtree(*child.value(), name, options, units, planned);
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

}  // namespace

std::vector<UnitPlan> plan_units(torch::nn::Module& root, const FsdpOptions& options) {
  std::vector<UnitPlan> units;
  std::unordered_set<const c10::TensorImpl*> planned;
  UnitPlan rest = plan_subtree(root, "", options, units, planned);
  if (!rest.params.empty()) units.push_back(std::move(rest));
  return units;
}

}  // namespace cpprun::detail
