// Activation checkpointing: run part of a model without keeping its activations, and run it again
// in backward to get them back. Memory for activations then grows like one checkpointed segment
// plus the segment inputs, not like the whole model (torch.utils.checkpoint for LibTorch).
//
//   struct Gpt : torch::nn::Module {
//     torch::Tensor forward(torch::Tensor x) {
//       for (auto& block : blocks) x = cpprun::checkpoint([block](const torch::Tensor& h) { return block->forward(h); }, x);
//       return head(x);
//     }
//   };
//
// Works with plain LibTorch and under DistributedDataParallel and FullyShardedDataParallel (every
// ZeRO stage; ZeRO-3 gathers the segment's units again for the recomputation and releases them
// after). See Note [How a segment is recomputed] in training/activation_checkpoint.cpp.
//
// What the function may do: use its inputs, and parameters (or other leaf tensors) it reaches by
// itself, e.g. a module's; draw random numbers (dropout gives the same mask again: the CPU and
// the inputs' CUDA generators are replayed); run under autocast. What it may not do: use another
// tensor that requires grad and is not a leaf (an activation captured from outside) — pass it as
// an input; the error says so. It must compute the same thing when run again (no side effects
// that change its result, e.g. a counter), and it is kept and called again in backward, after
// the code that made it has moved on: capture by value what changes (a loop index, a block), as
// the example does, never a local by reference (a module holder such as torch::nn::Linear is
// const inside a lambda: capture its .ptr(), or make the lambda mutable).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <vector>

namespace cpprun {

// Runs function(inputs) and returns its outputs; only `inputs` are kept for backward, which runs
// function again. Outside grad mode (evaluation), just runs it.
std::vector<at::Tensor> checkpoint(const std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>& function,
                                   const std::vector<at::Tensor>& inputs);

// The common one-tensor case: x = cpprun::checkpoint([&](const at::Tensor& h) { return block->forward(h); }, x);
at::Tensor checkpoint(const std::function<at::Tensor(const at::Tensor&)>& function, const at::Tensor& input);

// torch.utils.checkpoint.checkpoint_sequential: runs the functions one after another on `input`,
// in `segments` parts: the first segments - 1 parts (count / segments functions each) each
// checkpointed, the last part (the rest) run as usual. 1 <= segments <= count, else an error.
at::Tensor checkpoint_sequential(const std::vector<std::function<at::Tensor(const at::Tensor&)>>& functions,
                                 int64_t segments, const at::Tensor& input);

// The same over a torch::nn::Sequential (or a shared_ptr to its impl), each module taking and
// returning one tensor: x = cpprun::checkpoint_sequential(body, 4, x);
template <typename Sequential>
  requires requires(const Sequential& sequential) { sequential->size(); sequential->begin()->ptr(); }
at::Tensor checkpoint_sequential(const Sequential& sequential, int64_t segments, const at::Tensor& input) {
  std::vector<std::function<at::Tensor(const at::Tensor&)>> functions;
  for (auto module = sequential->begin(); module != sequential->end(); ++module) {
    // The module itself, shared, not the container's slot: the call outlives this frame.
    functions.emplace_back([any = *module](const at::Tensor& x) mutable { return any.template forward<at::Tensor>(x); });
  }
  return checkpoint_sequential(functions, segments, input);
}

}  // namespace cpprun
