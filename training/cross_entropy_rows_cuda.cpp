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

namespace cpprun::detail {

// The text of training/cross_entropy_kernels.cuh, embedded by CMake (Note [Kernels as text]).
const std::string& cross_entropy_kernel_source() {
  static const std::string source =
#include "cross_entropy_kernels.cuh.inc"
      ;
  return source;
}

#ifdef CPPRUN_WITH_CUDA
namespace {

struct CrossEntropyKernels {
  void* forward = nullptr;
  void* backward = nullptr;
};

int dtype_code(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat: return 0;
    case at::kDouble: return 1;
    case at::kBFloat16: return 2;
    case at::kHalf: return 3;
    default: TORCH_CHECK(false, "cpprun::fused_cross_entropy: no CUDA kernel for logits of dtype ", dtype);
  }
}

// The calling thread's CUDA context: the runtime makes the device's primary context current on its
// first call in a thread, which an autograd worker thread may not have made yet (LibTorch's
// jiterator does the same before its driver calls).
void make_context_current() {
  if (!cuda_context_current()) C10_CUDA_CHECK(cudaFree(nullptr));
}

// Compiled and loaded once per (device, dtype), under a lock; kept for the process's life.
const CrossEntropyKernels& kernels_for(const at::Tensor& logits) {
  static std::mutex mutex;
  static std::map<std::pair<int, int>, std::pair<std::unique_ptr<CudaModule>, CrossEntropyKernels>> loaded;
  const int code = dtype_code(logits.scalar_type());
  const int device = logits.device().index();
  std::lock_guard<std::mutex> lock(mutex);
  auto found = loaded.find({device, code});
  if (found != loaded.end()) return found->second.second;
  const auto* properties = at::cuda::getDeviceProperties(device);
  const NvrtcTarget target = nvrtc_target(properties->major * 10 + properties->minor, nvrtc_supported_archs());
  const std::string binary = nvrtc_compile(cross_entropy_kernel_source(), "cpprun_cross_entropy.cu", target,
                                           {"--std=c++17", "-DCE_DTYPE=" + std::to_string(code)});
  make_context_current();
  auto module = std::make_unique<CudaModule>(binary);
  CrossEntropyKernels kernels{module->kernel(kCrossEntropyForwardKernel), module->kernel(kCrossEntropyBackwardKernel)};
  auto& slot = loaded[{device, code}];
  slot = {std::move(module), kernels};
  return slot.second;
}

bool aligned16(const void* pointer) { return reinterpret_cast<std::uintptr_t>(pointer) % 16 == 0; }

// Whether both kernels may read and write the rows 16 bytes at a time.
int chunked_rows(const at::Tensor& logits, const void* grad) {
  const int64_t element = static_cast<int64_t>(logits.element_size());
  const bool fits = aligned16(logits.const_data_ptr()) && (logits.stride(0) * element) % 16 == 0 &&
                    (logits.size(1) * element) % 16 == 0 && (grad == nullptr || aligned16(grad));
  return fits ? 1 : 0;
}

unsigned threads_for(int64_t columns) { return columns >= 4096 ? 512 : 128; }

}  // namespace

CrossEntropyRows cross_entropy_rows_cuda(const at::Tensor& logits, const at::Tensor& target, int64_t ignore_index) {
  c10::cuda::CUDAGuard guard(logits.device());
  const auto options = logits.options().dtype(cross_entropy_accumulate_dtype(logits));
  CrossEntropyRows rows{at::empty({logits.size(0)}, options), at::empty({logits.size(0)}, options)};
  if (logits.size(0) == 0) return rows;
  const CrossEntropyKernels& kernels = kernels_for(logits);
  make_context_current();
  const void* x = logits.const_data_ptr();
  const void* t = target.const_data_ptr();
  int64_t columns = logits.size(1);
  int64_t row_stride = logits.stride(0);
  int chunked = chunked_rows(logits, nullptr);
  void* loss = rows.loss.data_ptr();
  void* lse = rows.lse.data_ptr();
  void* args[] = {&x, &t, &columns, &row_stride, &ignore_index, &chunked, &loss, &lse};
  launch_kernel(kernels.forward, static_cast<unsigned>(logits.size(0)), threads_for(columns), 0,
                at::cuda::getCurrentCUDAStream(logits.device().index()).stream(), args);
  return rows;
}

at::Tensor cross_entropy_grad_cuda(const at::Tensor& logits, const at::Tensor& target, int64_t ignore_index,
                                   const at::Tensor& row_lse, const at::Tensor& row_scale) {
  c10::cuda::CUDAGuard guard(logits.device());
  at::Tensor grad = at::empty({logits.size(0), logits.size(1)}, logits.options());
  if (logits.size(0) == 0) return grad;
  const CrossEntropyKernels& kernels = kernels_for(logits);
  make_context_current();
  const void* x = logits.const_data_ptr();
  const void* t = target.const_data_ptr();
  int64_t columns = logits.size(1);
  int64_t row_stride = logits.stride(0);
  int chunked = chunked_rows(logits, grad.data_ptr());
  const void* lse = row_lse.const_data_ptr();
  const void* scale = row_scale.const_data_ptr();
  void* out = grad.data_ptr();
  void* args[] = {&x, &t, &columns, &row_stride, &ignore_index, &chunked, &lse, &scale, &out};
  launch_kernel(kernels.backward, static_cast<unsigned>(logits.size(0)), threads_for(columns), 0,
                at::cuda::getCurrentCUDAStream(logits.device().index()).stream(), args);
  return grad;
}

#else  // a LibTorch without CUDA: no tensor can be on a GPU, so these are never reached

CrossEntropyRows cross_entropy_rows_cuda(const at::Tensor&, const at::Tensor&, int64_t) {
  TORCH_CHECK(false, "cpprun::fused_cross_entropy: cpprun was built against a LibTorch without CUDA");
}

at::Tensor cross_entropy_grad_cuda(const at::Tensor&, const at::Tensor&, int64_t, const at::Tensor&,
                                   const at::Tensor&) {
  TORCH_CHECK(false, "cpprun::fused_cross_entropy: cpprun was built against a LibTorch without CUDA");
}

#endif

}  // namespace cpprun::detail
