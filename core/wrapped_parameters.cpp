// See wrapped_parameters.h.
#include "core/wrapped_parameters.h"

#include <c10/util/Exception.h>

#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>

// Note [One data-parallel wrapper per parameter]
// A wrapper takes a module's parameters as they are when it is built: DDP hooks their gradient
// accumulators and broadcasts rank 0's values; FSDP moves them into its buckets and hands the
// optimizer shards, a different set of rows on each rank. Wrapped again, or split afterwards, they
// trained wrong without a word (an audit, 2026-12-07): DDP over FSDP broadcast rank 0's shards
// over every rank's (the model's state lost); FSDP over DDP raced DDP's hooks on the same
// gradients (wrong in about half the runs); FSDP over FSDP crashed at stage 3; parallelize_module
// after DDP or FSDP replaced parameters the wrapper no longer saw (no averaging; FSDP trained
// nothing, and a save wrote one rank's part as the whole). So while a wrapper lives the
// parameters it took are noted here, and FSDP, DDP and parallelize_module look before they take
// any. DDP over DDP is let be: each averages the same gradient, the result is the same (PyTorch
// does not refuse it either). PyTorch's FSDP2 marks the module it shards (fully_shard twice on
// one module is an error there too), and DTensor parameters tell the others what they are.

namespace cpprun::detail {
namespace {

struct Holder {
  const char* wrapper;
  int count;  // wrappers of that kind holding it (DDP over DDP)
};

std::mutex& wrapped_mutex() {
  static std::mutex mutex;
  return mutex;
}

std::unordered_map<const c10::TensorImpl*, Holder>& wrapped_registry() {
  static std::unordered_map<const c10::TensorImpl*, Holder> held;
  return held;
}

constexpr const char* kFsdp = "cpprun::FullyShardedDataParallel";

// What to do instead, for `who` taking what `holder` holds.
std::string instead(const char* who, const char* holder) {
  const bool by_fsdp = std::strcmp(holder, kFsdp) == 0;
  if (std::strcmp(who, "cpprun::parallelize_module") == 0) {
    return "Tensor parallelism replaces each parameter with this rank's part, which the wrapper built before it "
           "never sees. Parallelize first, then wrap: parallelize_module(model, tp_group, plan), then the "
           "data-parallel wrapper over the data-parallel group (docs/tensor_parallel.md, \"Order\").";
  }
  if (std::strcmp(who, kFsdp) != 0) {  // DDP over FSDP
    return "FSDP holds them (its shards, a different set of rows on each rank, which DDP would overwrite with "
           "rank 0's, or the full parameters it gathers into) and reduces their gradients itself. Use the FSDP "
           "wrapper alone (for replicas too: HSDP, FSDP over a 2-D DeviceMesh).";
  }
  return by_fsdp ? std::string("Wrap a module once: to shard an inner module as its own unit, name it in the outer "
                               "wrapper's FsdpOptions().wrap_policy(...) rather than wrapping it first.")
                 : std::string("Wrap a module once: FSDP reduces the gradients itself, and DDP's hooks on the same "
                               "ones race with it. Wrap the bare module in FSDP alone.");
}

}  // namespace

WrappedParameters::WrappedParameters(const char* wrapper, const std::vector<at::Tensor>& params) {
  std::lock_guard<std::mutex> lock(wrapped_mutex());
  auto& held = wrapped_registry();
  for (const auto& p : params) {
    const c10::TensorImpl* impl = p.unsafeGetTensorImpl();
    auto [it, fresh] = held.emplace(impl, Holder{wrapper, 0});
    if (fresh || std::strcmp(it->second.wrapper, wrapper) == 0) {
      ++it->second.count;
      params_.push_back(impl);
    }
  }
}

WrappedParameters::~WrappedParameters() {
  std::lock_guard<std::mutex> lock(wrapped_mutex());
  auto& held = wrapped_registry();
  for (const c10::TensorImpl* impl : params_) {
    const auto it = held.find(impl);
    if (it != held.end() && --it->second.count == 0) held.erase(it);
  }
}

void refuse_wrapped_parameters(const torch::nn::Module& module, const char* who, RefuseWrapped which,
                               const std::string& prefix) {
  std::string name;
  const char* holder = nullptr;
  {
    std::lock_guard<std::mutex> lock(wrapped_mutex());
    const auto& held = wrapped_registry();
    if (held.empty()) return;
    for (const auto& item : module.named_parameters(/*recurse=*/true)) {
      const auto it = held.find(item.value().unsafeGetTensorImpl());
      if (it == held.end()) continue;
      if (which == RefuseWrapped::kSharded && std::strcmp(it->second.wrapper, kFsdp) != 0) continue;
      name = prefix + item.key();
      holder = it->second.wrapper;
      break;
    }
  }
  TORCH_CHECK(holder == nullptr, who, ": the module's parameter \"", name, "\" is held by a ", holder,
              " that is still alive (this module, one inside it or one around it was wrapped already), and taking it "
              "again would train wrong. ", instead(who, holder));
}

}  // namespace cpprun::detail
