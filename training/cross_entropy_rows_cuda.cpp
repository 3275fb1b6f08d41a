// See training/cross_entropy_rows.h. The kernels are a string compiled by NVRTC at first use per
// device and dtype (support/runtime_kernels.h), so the library needs no CUDA compiler to build,
// and a test compiles the same string on a machine without a GPU.
#include "training/cross_entropy_rows.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "support/runtime_kernels.h"

#ifdef CPPRUN_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>

#include <map>
#include <memory>
#include <mutex>
#include <utility>
#endif

#include <string>
#include <vector>

namespace cpprun::detail {

// The text of training/cross_entropy_kernels.cuh, embedded by CMake (Note [Kernels as text]).
const std::string& cross_entropy_kernel_source() {
  static const std::string source =
#include "cross_entropy_kernels.cuh.inc"
      ;
  return source;
}

std::vector<std::string> cross_entropy_compile_options(at::ScalarType dtype) {
  int code = 0;
  switch (dtype) {
    case at::kFloat: code = 0; break;
    case at::kDouble: code = 1; break;
    case at::kBFloat16: code = 2; break;
    case at::kHalf: code = 3; break;
    default: TORCH_CHECK(false, "cpprun::fused_cross_entropy: no CUDA kernel for logits of dtype ", dtype);
  }
  return {"--std=c++17", "-DCE_DTYPE=" + std::to_string(code)};
}

#ifdef CPPRUN_WITH_CUDA
namespace {

struct CrossEntropyKernels {
  void* forward = nullptr;
  void* backward = nullptr;
};

// The calling thread's CUDA context: the runtime makes the device's primary context current on its
// first call in a thread, which an autograd worker thread may not have made yet (LibTorch's
// jiterator does the same before its driver calls).
void make_context_current() {
  if (!cuda_context_current()) C10_CUDA_CHECK(cudaFree(nullptr));
}

// Compiled and loaded once per (device, dtype), under a lock; kept for the process's life. The
// caller holds a guard for `device`.
const CrossEntropyKernels& kernels_for(int device, at::ScalarType dtype) {
  static std::mutex mutex;
  static std::map<std::pair<int, at::ScalarType>, std::pair<std::unique_ptr<CudaModule>, CrossEntropyKernels>> loaded;
  std::lock_guard<std::mutex> lock(mutex);
  auto found = loaded.find({device, dtype});
  if (found != loaded.end()) return found->second.second;
  const std::vector<std::string> options = cross_entropy_compile_options(dtype);  // refuses a dtype first
  const auto* properties = at::cuda::getDeviceProperties(device);
  const NvrtcTarget target = nvrtc_target(properties->major * 10 + properties->minor, nvrtc_supported_archs());
  const std::string binary = nvrtc_compile(cross_entropy_kernel_source(), "cpprun_cross_entropy.cu", target, options);
  make_context_current();
  auto module = std::make_unique<CudaModule>(binary);
  CrossEntropyKernels kernels{module->kernel(kCrossEntropyForwardKernel), module->kernel(kCrossEntropyBackwardKernel)};
  auto& slot = loaded[{device, dtype}];
  slot = {std::move(module), kernels};
  return slot.second;
}

bool aligned16(const void* pointer) { return reinterpret_cast<std::uintptr_t>(pointer) % 16 == 0; }

// Launches the forward or the backward kernel, a block a row of logits, on the current stream of
// their device. Both take the same six arguments first (logits, target, columns, row stride,
// ignore_index, whether rows go 16 bytes at a time), then their own pointers; `grad` is the
// backward's output, whose rows go 16 bytes at a time too.
void launch_rows(bool forward, const at::Tensor& logits, const at::Tensor& target, int64_t ignore_index,
                 std::vector<const void*> own_pointers, const void* grad = nullptr) {
  const int device = logits.device().index();
  const CrossEntropyKernels& kernels = kernels_for(device, logits.scalar_type());
  make_context_current();
  const void* x = logits.const_data_ptr();
  const void* t = target.const_data_ptr();
  int64_t columns = logits.size(1);
  int64_t row_stride = logits.stride(0);
  const int64_t element = static_cast<int64_t>(logits.element_size());
  int chunked = aligned16(x) && (row_stride * element) % 16 == 0 && (columns * element) % 16 == 0 &&
                (grad == nullptr || aligned16(grad));
  std::vector<void*> args{&x, &t, &columns, &row_stride, &ignore_index, &chunked};
  for (const void*& p : own_pointers) args.push_back(&p);
  const unsigned threads = columns >= 4096 ? 512 : 128;
  launch_kernel(forward ? kernels.forward : kernels.backward, static_cast<unsigned>(logits.size(0)), threads, 0,
                at::cuda::getCurrentCUDAStream(device).stream(), args.data());
}

}  // namespace

void cross_entropy_kernels_load(const at::Device& device, at::ScalarType dtype) {
  TORCH_CHECK(device.is_cuda(), "cpprun::fused_cross_entropy: its kernels are CUDA's, not ", device, "'s");
  cross_entropy_compile_options(dtype);  // a dtype without a kernel is refused before the device is touched
  const c10::DeviceIndex index = device.has_index() ? device.index() : c10::cuda::current_device();
  c10::cuda::CUDAGuard guard(index);
  kernels_for(index, dtype);
}

CrossEntropyRows cross_entropy_rows_cuda(const at::Tensor& logits, const at::Tensor& target, int64_t ignore_index) {
  c10::cuda::CUDAGuard guard(logits.device());
  const auto options = logits.options().dtype(cross_entropy_accumulate_dtype(logits));
  CrossEntropyRows rows{at::empty({logits.size(0)}, options), at::empty({logits.size(0)}, options)};
  if (logits.size(0) == 0) return rows;
  launch_rows(true, logits, target, ignore_index, {rows.loss.data_ptr(), rows.lse.data_ptr()});
  return rows;
}

at::Tensor cross_entropy_grad_cuda(const at::Tensor& logits, const at::Tensor& target, int64_t ignore_index,
                                   const at::Tensor& row_lse, const at::Tensor& row_scale) {
  c10::cuda::CUDAGuard guard(logits.device());
  at::Tensor grad = at::empty({logits.size(0), logits.size(1)}, logits.options());
  if (logits.size(0) == 0) return grad;
  launch_rows(false, logits, target, ignore_index,
              {row_lse.const_data_ptr(), row_scale.const_data_ptr(), grad.data_ptr()}, grad.data_ptr());
  return grad;
}

#else  // a LibTorch without CUDA: no tensor can be on a GPU, so these are never reached

void cross_entropy_kernels_load(const at::Device&, at::ScalarType) {
  TORCH_CHECK(false, "cpprun::fused_cross_entropy: cpprun was built against a LibTorch without CUDA");
}

CrossEntropyRows cross_entropy_rows_cuda(const at::Tensor&, const at::Tensor&, int64_t) {
  TORCH_CHECK(false, "cpprun::fused_cross_entropy: cpprun was built against a LibTorch without CUDA");
}

at::Tensor cross_entropy_grad_cuda(const at::Tensor&, const at::Tensor&, int64_t, const at::Tensor&,
                                   const at::Tensor&) {
  TORCH_CHECK(false, "cpprun::fused_cross_entropy: cpprun was built against a LibTorch without CUDA");
}

#endif

}  // namespace cpprun::detail
