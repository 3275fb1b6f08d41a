// See unit_plan.h. Post-order, as PyTorch's size_based_auto_wrap_policy: a child becomes a unit
// when the policy selects it or when the parameters it holds outside smaller units (frozen ones
// counted, as PyTorch counts them) reach the minimum; otherwise its parameters stay with its
// parent. A tensor registered under several names (tied, e.g. an embedding and the output layer)
// is planned once, where the walk meets it first.
#include "fsdp/unit_plan.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <unordered_map>
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
                      std::vector<UnitPlan>& units, std::unordered_set<const c10::TensorImpl*>& planned,
                      std::size_t& walked) {
  UnitPlan rest;
  rest.name = prefix;
  rest.preorder = walked++;
  for (const auto& item : module.named_parameters(/*recurse=*/false)) {
    if (!planned.insert(item.value().unsafeGetTensorImpl()).second) continue;  // tied: planned already
    rest.param_names.push_back(prefix.empty() ? item.key() : prefix + "." + item.key());
    rest.params.push_back(item.value());
  }
  for (const auto& child : module.named_children()) {
    const std::string name = prefix.empty() ? child.key() : prefix + "." + child.key();
    UnitPlan sub = plan_subtree(*child.value(), name, options, units, planned, walked);
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

// Each parameter's memory must be its own: its bucket takes it over. A tensor registered under two
// names (tied) is one parameter and was planned once; two different tensors over the same memory
// (tied with set_data, or one a view of the other) cannot both be moved into a bucket and stay
// tied.
void check_not_sharing_memory(const std::vector<UnitPlan>& units) {
  std::unordered_map<const void*, std::string> owner;
  for (const auto& unit : units) {
    for (std::size_t i = 0; i < unit.params.size(); ++i) {
      const void* memory = unit.params[i].storage().unsafeGetStorageImpl();
      auto [it, fresh] = owner.emplace(memory, unit.param_names[i]);
      TORCH_CHECK(fresh, "cpprun::FullyShardedDataParallel: parameters \"", unit.param_names[i], "\" and \"", it->second,
                  "\" are different tensors over the same memory (tied with set_data, or one a view of the other). "
                  "Tie parameters by registering the same tensor under both names (register_parameter(\"weight\", "
                  "other->weight)); FSDP then keeps one copy and sums its gradients.");
    }
  }
}

}  // namespace

std::vector<UnitPlan> plan_units(torch::nn::Module& root, const FsdpOptions& options) {
  std::vector<UnitPlan> units;
  std::unordered_set<const c10::TensorImpl*> planned;
  std::size_t walked = 0;
  UnitPlan rest = plan_subtree(root, "", options, units, planned, walked);
  if (!rest.params.empty()) units.push_back(std::move(rest));
  const bool trains = std::any_of(units.begin(), units.end(), [](const UnitPlan& unit) {
    return std::any_of(unit.params.begin(), unit.params.end(), [](const at::Tensor& p) { return p.requires_grad(); });
  });
  TORCH_CHECK(trains, "cpprun::FullyShardedDataParallel: the module has no parameter that requires grad.");
  check_not_sharing_memory(units);
  return units;
}

}  // namespace cpprun::detail
