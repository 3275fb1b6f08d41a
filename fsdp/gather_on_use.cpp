// See gather_on_use.h.
#include "fsdp/gather_on_use.h"

#include <c10/core/impl/LocalDispatchKeySet.h>

#include <algorithm>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "comm/public_call.h"
#include "core/extension_key.h"
#include "fsdp/full_gradient_guard.h"

namespace cpprun::detail {
namespace {

constexpr c10::DispatchKey kWatchKey = kExtensionKey;

struct Watch {
  UseListener* listener;
  std::size_t unit;
};

std::mutex& registry_mutex() {
  static std::mutex mutex;
  return mutex;
}
std::unordered_map<const c10::StorageImpl*, Watch>& watch_registry() {
  static std::unordered_map<const c10::StorageImpl*, Watch> watches;
  return watches;
}

struct Write {
  Watch watch;
  at::Tensor tensor;
};

// Whether the operator writes this argument in place: `Tensor(a!)`, or `Tensor(a!)[]` (foreach).
bool writes_in_place(const c10::Argument& argument) {
  const c10::AliasInfo* info = argument.alias_info();
  if (info == nullptr) return false;
  if (info->isWrite()) return true;
  return std::any_of(info->containedTypes().begin(), info->containedTypes().end(),
                     [](const c10::AliasInfo& contained) { return contained.isWrite(); });
}

// `tensor` is (an item of) `argument`; if watched, it is recorded in `uses`, and in `writes` if the
// operator writes it: the schema is read for watched tensors only.
void collect(const at::Tensor& tensor, const c10::Argument& argument, std::vector<Watch>& uses,
             std::vector<Write>& writes) {
  if (!tensor.defined() || !tensor.key_set().has(kWatchKey) || !tensor.has_storage()) return;
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto it = watch_registry().find(tensor.storage().unsafeGetStorageImpl());
  if (it == watch_registry().end()) return;
  const Watch& w = it->second;
  const bool seen = std::any_of(uses.begin(), uses.end(),
                                [&](const Watch& u) { return u.listener == w.listener && u.unit == w.unit; });
  if (!seen) uses.push_back(w);
  if (writes_in_place(argument)) writes.push_back({w, tensor});
}

}  // namespace

void report_uses_then_run(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  // A full parameter's gradient guard (Note [Full gradients after a synchronized backward]).
  if (handle_full_gradient_use(op, stack)) return;
  std::vector<Watch> uses;
  std::vector<Write> written;
  const std::vector<c10::Argument>& schema = op.schema().arguments();
  const auto args = torch::jit::last(*stack, schema.size());
  for (std::size_t i = 0; i < args.size(); ++i) {
    const c10::IValue& arg = args[i];
    if (arg.isTensor()) {
      collect(arg.toTensor(), schema[i], uses, written);
    } else if (arg.isList()) {  // Tensor[] and Tensor?[]
      for (const c10::IValue& item : arg.toListRef()) {
        if (item.isTensor()) collect(item.toTensor(), schema[i], uses, written);
      }
    }
  }
  {
    // The listener's own operators (its collectives' copies) must not report back here.
    c10::impl::ExcludeDispatchKeyGuard no_reentry(kWatchKey);
    PublicCallScope call("FullyShardedDataParallel's gather on use");
    // A refused write is refused before anything is gathered for it.
    for (const Write& w : written) w.watch.listener->before_write(w.watch.unit, w.tensor, op.operator_name());
    while (!uses.empty()) {
      UseListener* listener = uses.front().listener;
      std::vector<std::size_t> units;
      for (auto it = uses.begin(); it != uses.end();) {
        if (it->listener == listener) {
          units.push_back(it->unit);
          it = uses.erase(it);
        } else {
          ++it;
        }
      }
      listener->before_use(units);
    }
  }
  redispatch_below_extension_key(op, keys, stack);
  if (written.empty()) return;
  c10::impl::ExcludeDispatchKeyGuard no_reentry(kWatchKey);
  for (const Write& w : written) w.watch.listener->after_write(w.watch.unit, w.tensor);
}

void watch_uses(const at::Tensor& storage_of, const std::vector<at::Tensor>& tensors, UseListener& listener,
                std::size_t unit) {
  set_extension_handler(&report_uses_then_run);
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    watch_registry()[storage_of.storage().unsafeGetStorageImpl()] = Watch{&listener, unit};
  }
  for (const auto& t : tensors) set_extension_key(t, true);
}

void unwatch_uses(const at::Tensor& storage_of, const std::vector<at::Tensor>& tensors) {
  for (const auto& t : tensors) set_extension_key(t, false);
  std::lock_guard<std::mutex> lock(registry_mutex());
  watch_registry().erase(storage_of.storage().unsafeGetStorageImpl());
}

}  // namespace cpprun::detail
