// The per-row work of cpprun::fused_cross_entropy on CUDA (training/cross_entropy_rows_cuda.cpp):
// two kernels compiled at first use by NVRTC for the device's architecture and the logits' dtype.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace cpprun::detail {

// float64 for float64 logits, else float32: what the rows' sums and the gradient are computed in.
inline at::ScalarType cross_entropy_accumulate_dtype(const at::Tensor& logits) {
  return logits.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// Per row i of logits [N, C], in cross_entropy_accumulate_dtype: lse[i] = log(sum_j
// exp(logits[i, j])), and loss[i] = lse[i] - logits[i, target[i]], 0 where target[i] ==
// ignore_index, NaN where the target is outside [0, C).
struct CrossEntropyRows {
  at::Tensor loss, lse;
};

// The forward kernel: one read of the logits.
CrossEntropyRows cross_entropy_rows_cuda(const at::Tensor& logits, const at::Tensor& target, int64_t ignore_index);

// The gradient with respect to the logits, in their dtype: (softmax(logits[i]) - onehot(target[i]))
// * row_scale[i], zero in ignored rows. One read of the logits, one write of the gradient.
at::Tensor cross_entropy_grad_cuda(const at::Tensor& logits, const at::Tensor& target, int64_t ignore_index,
                                   const at::Tensor& row_lse, const at::Tensor& row_scale);

// Compiles and loads both kernels for `device` (a CUDA one) and logits of `dtype`, as their first
// use would: throws what stands in the way (no NVRTC, no driver, an architecture NVRTC lacks, a
// dtype without a kernel). Kept for the process's life, so the first step pays nothing more.
void cross_entropy_kernels_load(const at::Device& device, at::ScalarType dtype);

// Both kernels' source, compiled with cross_entropy_compile_options(dtype) (-DCE_DTYPE=0 float32,
// 1 float64, 2 bfloat16, 3 float16; refuses another dtype); the names of its kernels.
const std::string& cross_entropy_kernel_source();
std::vector<std::string> cross_entropy_compile_options(at::ScalarType dtype);
inline constexpr const char* kCrossEntropyForwardKernel = "cpprun_cross_entropy_rows";
inline constexpr const char* kCrossEntropyBackwardKernel = "cpprun_cross_entropy_grad";

}  // namespace cpprun::detail
