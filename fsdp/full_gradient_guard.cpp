// See full_gradient_guard.h.
#include "fsdp/full_gradient_guard.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>

#include "core/extension_key.h"
#include "fsdp/gather_on_use.h"

namespace cpprun::detail {

// Note [Full gradients after a synchronized backward]
// A synchronized backward leaves each parameter's reduced gradient in its shard's .grad (the
// tensors model->parameters() lists) and none in the wrapped module's own full parameter: stages
// 2 and 3 take it away to reduce-scatter it, stage 1 leaves a view of its full gradient, whose
// rows other than this rank's hold the reduce-scatter's partial sums (Note [Stage 1
// reduce-scatters] in gradient_sync.cpp).
// PyTorch's fully_shard registers the sharded parameters on the module itself
// (_fsdp_param.py, _setattr_on_modules), so model.parameters() and net.parameters() are the same
// after it. cpprun's wrapped module keeps its full parameters (module() users, pipeline stages
// and the forward read them), so an optimizer built over net->parameters() after wrapping, or
// over the module before wrapping (the same tensors), holds the full parameters: at stages 2 and
// 3 it finds no gradient and steps nothing; at stage 1 it steps copies the next all-gather
// overwrites, or steps them all with full-size state. Training goes on without an error.
// So from a synchronized backward's end until the next forward, each full parameter's .grad is a
// guard: one element broadcast to its shape (no memory to speak of), carrying cpprun's extension
// key, whose operators throw an error naming model->parameters(). What only drops it passes:
// zero_grad() detaches it and sets it to none, or zeroes it (nothing to do). Autograd adding a
// second backward's gradient into it does nothing, so that GradientSync's own error names that
// mistake. LibTorch's optimizers skip a parameter without a gradient, so an empty .grad could
// not be noticed; every optimizer reads a gradient it finds, so the guard cannot be missed.
namespace {

std::mutex& guard_mutex() {
  static std::mutex mutex;
  return mutex;
}
// Each guard's storage, with what its error names: the parameter and this rank.
struct GuardOwner {
  std::string name;
  int rank;
};
std::unordered_map<const c10::StorageImpl*, GuardOwner>& guard_owners() {
  static std::unordered_map<const c10::StorageImpl*, GuardOwner> owners;
  return owners;
}
// How many guards are set as gradients now: the handler looks no further while there are none.
std::atomic<int64_t> armed_guards{0};

std::optional<GuardOwner> owner_of(const at::Tensor& tensor) {
  if (!tensor.defined() || !tensor.key_set().has(kExtensionKey) || !tensor.has_storage()) return std::nullopt;
  std::lock_guard<std::mutex> lock(guard_mutex());
  auto it = guard_owners().find(tensor.storage().unsafeGetStorageImpl());
  if (it == guard_owners().end()) return std::nullopt;
  return it->second;
}

}  // namespace

FullGradientGuard::FullGradientGuard(std::span<const ParamBucket> buckets, int rank) {
  set_extension_handler(&report_uses_then_run);  // at stages 1 and 2 nothing else sets it
  at::NoGradGuard no_grad;
  for (const auto& bucket : buckets) {
    for (const auto& s : bucket.params()) {
      at::Tensor guard = at::zeros({}, s.param.options()).expand(s.param.sizes());
      set_extension_key(guard, true);
      {
        std::lock_guard<std::mutex> lock(guard_mutex());
        guard_owners()[guard.storage().unsafeGetStorageImpl()] = GuardOwner{s.name, rank};
      }
      params_.push_back(s.param);
      guards_.push_back(std::move(guard));
    }
  }
}

FullGradientGuard::~FullGradientGuard() {
  disarm();
  std::lock_guard<std::mutex> lock(guard_mutex());
  for (const auto& guard : guards_) guard_owners().erase(guard.storage().unsafeGetStorageImpl());
}

void FullGradientGuard::arm() {
  if (armed_) return;
  for (std::size_t i = 0; i < params_.size(); ++i) params_[i].mutable_grad() = guards_[i];
  armed_ = true;
  armed_guards += static_cast<int64_t>(guards_.size());
}

void FullGradientGuard::disarm() {
  if (!armed_) return;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    at::Tensor& grad = params_[i].mutable_grad();
    // zero_grad(false) leaves a detached view of the guard: the guard still.
    if (grad.defined() && grad.has_storage() && grad.storage().is_alias_of(guards_[i].storage())) grad = at::Tensor();
  }
  armed_ = false;
  armed_guards -= static_cast<int64_t>(guards_.size());
}

bool handle_full_gradient_use(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  if (armed_guards.load(std::memory_order_relaxed) == 0) return false;
  const auto& schema = op.schema();
  const std::size_t n = schema.arguments().size();
  std::optional<GuardOwner> owner;
  std::size_t position = 0;
  for (std::size_t i = 0; i < n && !owner; ++i) {
    const c10::IValue& arg = (*stack)[stack->size() - n + i];
    if (arg.isTensor()) {
      owner = owner_of(arg.toTensor());
      position = i;
    } else if (arg.isList()) {  // Tensor[] (the _foreach_ operators) and Tensor?[]
      for (const c10::IValue& item : arg.toListRef()) {
        if (item.isTensor() && (owner = owner_of(item.toTensor()))) break;
      }
      position = i;
    }
  }
  if (!owner) return false;
  const std::string& name = schema.name();
  // zero_grad() (the optimizer's and the module's) detaches a gradient before dropping it.
  const bool drops = name == "aten::detach" || name == "aten::detach_" || name == "aten::alias";
  // zero_grad(false) zeroes it; autograd adds a second backward's gradient into it. It stays a
  // guard, and the in-place operator returns it.
  const bool into = position == 0 && (name == "aten::zero_" || name == "aten::add_");
  TORCH_CHECK(drops || into, "cpprun::FullyShardedDataParallel (rank ", owner->rank, "): ", name, " read the .grad "
              "of \"", owner->name, "\" as the wrapped module holds it (its full parameter, which net->parameters() "
              "lists). After a synchronized backward that gradient is in this rank's shard of the parameter, which "
              "model->parameters() lists: an optimizer built over the wrapped module's own parameters "
              "(net->parameters() after wrapping, or any optimizer built before wrapping) would step nothing. Build "
              "it from the wrapper, as after PyTorch's fully_shard: torch::optim::AdamW opt(model->parameters(), "
              "lr); and clip with model->clip_grad_norm(max_norm).");
  if (drops) return false;
  at::Tensor self = (*stack)[stack->size() - n].toTensor();
  torch::jit::drop(*stack, n);
  torch::jit::push(*stack, std::move(self));
  return true;
}

bool is_full_gradient_guard(const at::Tensor& grad) {
  return armed_guards.load(std::memory_order_relaxed) > 0 && owner_of(grad).has_value();
}

}  // namespace cpprun::detail
