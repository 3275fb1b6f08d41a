// Deferred initialisation: build a module without allocating its parameters, then give them
// memory and values later, all at once (materialize) or unit by unit under ZeRO-3
// (FullyShardedDataParallel does it by itself), so that a rank never holds more than its shards
// plus the unit being initialised.
//
//   torch::manual_seed(0);
//   auto net = cpprun::deferred_init([&] { return std::make_shared<Net>(cfg); });  // no memory
//   auto model = cpprun::FullyShardedDataParallel(net, group, cpprun::FsdpOptions().stage(3));
//   // or, without FSDP:  cpprun::materialize(*net);
//
// Inside the scope, tensor factories (torch::empty, zeros, ones, full, rand, randn, arange, ...)
// return tensors with their sizes, dtype and device but no memory, and the initialisation ops
// applied to them (normal_, uniform_, zero_, fill_, copy_, mul_, ... as torch::nn::init and the
// modules' reset_parameters use them; views too) are recorded. Materialising runs the records in
// the order they were made, drawing from the same random generators, so the values are exactly
// those eager construction gives with the same seed, and the generators end where eager
// construction leaves them. Any other op on a deferred tensor throws, naming the op.
//
// The scope is per thread. Draw no random numbers between the scope and the materialisation if
// they must match an eager run (the deferred draws happen at materialisation).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <utility>

namespace cpprun {

// While alive, tensor factories on this thread make deferred tensors (see above).
class DeferredInitGuard {
 public:
  DeferredInitGuard();
  ~DeferredInitGuard();
  DeferredInitGuard(const DeferredInitGuard&) = delete;
  DeferredInitGuard& operator=(const DeferredInitGuard&) = delete;

 private:
  bool key_was_included_;
};

// Runs `build` (e.g. a lambda returning std::make_shared<Net>(...)) with deferred initialisation
// and returns what it returns.
template <typename Build>
auto deferred_init(Build&& build) -> decltype(std::forward<Build>(build)()) {
  DeferredInitGuard deferred;
  return std::forward<Build>(build)();
}

// Whether `tensor` (or the tensor it is a view of) still waits for its memory and values.
bool is_deferred(const at::Tensor& tensor);

// Gives every deferred parameter and buffer of `module` (recursively) its memory and the values
// eager construction would have given, replaying their records in recording order. Does nothing
// to tensors that are not deferred. For DDP or a single process; FullyShardedDataParallel
// materialises a deferred module by itself, one unit at a time.
void materialize(torch::nn::Module& module);
template <typename ModuleType>
void materialize(torch::nn::ModuleHolder<ModuleType>& module) {
  materialize(*module);
}

}  // namespace cpprun
