// Runs a listener before any operator that takes a watched tensor: how ZeRO-3 knows that a
// unit's parameters are about to be used (in forward, or by autograd in backward) without
// module hooks, which LibTorch does not have.
//
// Watched tensors carry one extra dispatch key (core/extension_key.h), whose fallback runs
// report_uses_then_run (registered by the first watch): it calls the listener with the units
// whose storage the operator's tensor arguments share, then
// re-dispatches the operator below the key. Views of a watched tensor inherit the key, so the
// tensors autograd saves for backward (e.g. a weight's transpose) are watched as well. An
// operator that writes a watched tensor in place (its schema marks the argument `Tensor(a!)`) is
// shown to the listener before and after it runs (Note [In-place writes to full parameters] in
// full_parameter_writes.cpp).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <cstddef>
#include <vector>

namespace cpprun::detail {

class UseListener {
 public:
  virtual ~UseListener() = default;
  // `units`: each unit (once) whose watched storage the operator about to run takes. Runs on the
  // thread that runs the operator (autograd's, in backward). Operators it runs itself on watched
  // tensors are not reported again.
  virtual void before_use(const std::vector<std::size_t>& units) = 0;
  // `op` is about to write `written` (a watched tensor of `unit`, or a view of one, `.data()`
  // included) in place; before before_use. Throws to refuse the write.
  virtual void before_write(std::size_t unit, const at::Tensor& written, const c10::OperatorName& op) = 0;
  // It wrote it.
  virtual void after_write(std::size_t unit, const at::Tensor& written) = 0;
};

// Every operator on a tensor in `tensors` (which must share `storage_of`'s storage) or on a view
// of one reports `unit` to `listener` first. The listener must outlive the watch.
void watch_uses(const at::Tensor& storage_of, const std::vector<at::Tensor>& tensors, UseListener& listener,
                std::size_t unit);
// Ends watch_uses: the tensors lose the key and the storage its listener.
void unwatch_uses(const at::Tensor& storage_of, const std::vector<at::Tensor>& tensors);

// The extension key's handler (core/extension_key.h) for an operator that is no deferred
// initialisation's business: reports the watched units among its arguments, then runs it (a
// full parameter's gradient guard's operator is full_gradient_guard.h's).
void report_uses_then_run(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack);

}  // namespace cpprun::detail
