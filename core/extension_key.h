// The one dispatch key cpprun claims, DispatchKey::DeferredInit (reserved for out-of-tree
// extensions; nothing in LibTorch registers it), and its one boxed fallback. Two features put it
// on tensors, and the fallback routes each operator to the one concerned:
//  - deferred initialisation (core/deferred_init.h): parameters built inside a deferred_init
//    scope carry the key; their initialisation ops are recorded instead of run;
//  - ZeRO-3's gather on use (fsdp/gather_on_use.h): a unit's parameters carry it so that the
//    first operator to use them gathers the unit. FSDP registers itself here (a higher layer
//    registers with a lower one; core/ never includes fsdp/).
// A tensor is never both: FSDP materialises a deferred parameter before it watches it.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/DispatchKey.h>

namespace cpprun::detail {

constexpr c10::DispatchKey kExtensionKey = c10::DispatchKey::DeferredInit;

// Adds or removes the key on this TensorImpl (not on other views of its storage).
void set_extension_key(const at::Tensor& tensor, bool on);

// What the fallback runs for an operator that is not deferred initialisation's business; it must
// end by running the operator (redispatch_below_extension_key). One may be set (FSDP's gather on
// use); setting the same one again is a no-op. Without one the operator simply runs.
using ExtensionHandler = void (*)(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack);
void set_extension_handler(ExtensionHandler handler);
// Runs `op` as if its tensors did not carry the key.
void redispatch_below_extension_key(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack);

}  // namespace cpprun::detail
