// cpprun::fused_cross_entropy: cross entropy of logits against class indices, as
// torch::nn::functional::cross_entropy computes it, without the float32 copies of the logits.
//
//   auto loss = cpprun::fused_cross_entropy(logits.view({-1, vocab}), targets.view({-1}));
//   loss.backward();
//
// Why: a language model's loss is its largest elementwise work. At GPT-2's vocabulary (50,304) and
// 16 x 1024 tokens the bf16 logits are 1.65 GB; cross_entropy(logits.float(), y) reads and writes
// them about ten times as float32 or bf16 (the cast, log_softmax, nll_loss's zero-filled gradient,
// log_softmax's backward, the cast back): about 30 GB a step, some 7 ms of an H200's ~48 ms step.
// On CUDA this reads the logits once in the forward (a row's maximum and sum of exponentials, in
// one pass) and once in the backward, which writes the gradient in the logits' own dtype: about
// 5 GB. This is what llm.c's fused classifier does; PyTorch eager runs the ten passes.
//
// Semantics are F::cross_entropy's for class-index targets: logits [N, C], target [N] int64, a
// target equal to ignore_index contributes neither loss nor gradient, reduction mean (over the
// rows not ignored; none left gives NaN, as PyTorch's), sum or none. Two deliberate differences:
// for bfloat16 and float16 logits the loss is float32 (it is computed in float32 either way; F's
// would round it to the logits' dtype), and the gradient with respect to the logits is in their
// dtype, computed in float32 (double for float64 logits). Class weights and label smoothing are
// refused (use F::cross_entropy for them); the function is differentiable once (no double backward).
//
// Devices: on CUDA two kernels compiled at first use by NVRTC (LibTorch's own runtime compiler,
// which the pip wheel carries) for the device's architecture; on the CPU ATen's logsumexp, gather
// and exp, the same semantics without a fused kernel. A target outside [0, C) is an error on the
// CPU and gives a NaN loss and gradient for its row on CUDA (checking would make the host wait
// for the device every step; PyTorch's CUDA kernel stops the process with a device-side assert).
#pragma once

#include <torch/nn/options/loss.h>
#include <torch/types.h>

#include <string>

namespace cpprun {

torch::Tensor fused_cross_entropy(const torch::Tensor& logits, const torch::Tensor& target,
                                  const torch::nn::functional::CrossEntropyFuncOptions& options = {});

// Whether fused_cross_entropy runs on `device` for logits of `dtype` in this process; if not and
// `why_not` is given, what stands in the way (on CUDA: NVRTC or the driver not found, the GPU's
// architecture unknown to NVRTC, a dtype without a kernel), for a program choosing its loss at the
// start instead of failing at its first step. On CUDA this compiles and loads the kernels for
// that device and dtype (well under a second), which the first call then finds ready.
bool fused_cross_entropy_available(const torch::Device& device, torch::ScalarType dtype,
                                   std::string* why_not = nullptr);

}  // namespace cpprun
