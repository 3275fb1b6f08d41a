// See extension_key.h.
#include "core/extension_key.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include <atomic>

#include "core/deferred_init.h"

namespace cpprun::detail {
namespace {

// TensorImpl has no public way to add a functionality key to an existing tensor, and a module's
// parameters must stay the same TensorImpls (modules hold them by value). A pointer to the
// protected member, taken through a derived class that is never instantiated.
struct KeySetAccess : c10::TensorImpl {
  static c10::DispatchKeySet c10::TensorImpl::*member() { return &KeySetAccess::key_set_; }
};

std::atomic<ExtensionHandler> handler{nullptr};

void run_handler(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  if (ExtensionHandler h = handler.load()) {
    h(op, keys, stack);
  } else {
    redispatch_below_extension_key(op, keys, stack);
  }
}

void route(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  if (record_deferred_op(op, keys, stack)) return;
  if (deferred_init_scope_active()) {
    // An operator on real tensors inside a deferred_init scope: the factories its kernel calls
    // (e.g. the output's at::empty) must allocate for real.
    c10::impl::ExcludeDispatchKeyGuard real_factories(kExtensionKey);
    run_handler(op, keys, stack);
    return;
  }
  run_handler(op, keys, stack);
}

}  // namespace

void set_extension_handler(ExtensionHandler h) {
  ExtensionHandler expected = nullptr;
  if (handler.compare_exchange_strong(expected, h)) return;
  TORCH_INTERNAL_ASSERT(expected == h, "a second extension-key handler");
}

void redispatch_below_extension_key(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  op.redispatchBoxed(keys & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kExtensionKey), stack);
}

void set_extension_key(const at::Tensor& tensor, bool on) {
  c10::TensorImpl* impl = tensor.unsafeGetTensorImpl();
  c10::DispatchKeySet& keys = impl->*KeySetAccess::member();
  keys = on ? keys.add(kExtensionKey) : keys.remove(kExtensionKey);
}

}  // namespace cpprun::detail

TORCH_LIBRARY_IMPL(_, DeferredInit, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&cpprun::detail::route>());
}
