// CUDA kernels compiled at run time: NVRTC turns a kernel's source into a binary for the device at
// hand, and the CUDA driver loads and launches it. Both libraries are found in the process, not
// linked: LibTorch's CUDA build carries NVRTC (libtorch_cuda.so needs it, as its jiterator does),
// and the driver (libcuda.so.1) exists only where a GPU does, so a program using this still starts
// on a machine without one. No CUDA header is needed either: the few entry points are declared
// here by their C ABI, which NVIDIA keeps stable.
//
// Decisions apart from I/O: nvrtc_target() chooses what to compile for, from the device's
// architecture and NVRTC's list, and is a pure function with unit tests.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace cpprun::detail {

// What NVRTC compiles for: a binary for the device's own architecture when NVRTC knows it
// (--gpu-architecture=sm_90, loaded as is), else PTX for the newest one it knows
// (compute_100, which the driver compiles for the device on load). Architectures as major * 10 +
// minor (9.0 -> 90).
struct NvrtcTarget {
  std::string arch_option;  // "--gpu-architecture=sm_90"
  bool binary = true;       // a cubin; false: PTX
};

// Throws when the device is older than every architecture NVRTC supports, naming both.
NvrtcTarget nvrtc_target(int device_arch, const std::vector<int>& supported_archs);

// NVRTC's supported architectures; throws, naming where it looked, when NVRTC is not found.
std::vector<int> nvrtc_supported_archs();

// Whether a library's file name is NVRTC itself: libnvrtc.so[.N[...]] as CUDA and the pip wheels
// name it, or libnvrtc-HASH.so.N as LibTorch's zip renames it. Not its builtins
// (libnvrtc-builtins*.so*, which NVRTC loads by itself), libnvrtc.alt.so* or a static archive.
bool is_nvrtc_library(const std::string& library_file);

// The NVRTC libraries among `paths` (is_nvrtc_library of their file names) in the order to try
// them: those of the CUDA runtime's major version `cuda_major` first (-1: not known), then the
// newest major version after ".so." first (13 before 12; a name without one last); otherwise in
// their order.
std::vector<std::string> nvrtc_libraries_in_order(const std::vector<std::string>& paths, int cuda_major);

// The major version of the CUDA runtime among the libraries `paths` (libcudart.so.13 or LibTorch's
// zip's libcudart-HASH.so.12), -1 when none is there.
int cuda_runtime_major(const std::vector<std::string>& paths);

// The binary (cubin or PTX, as `target` says) of `source`, compiled with `options` (beside the
// architecture). Throws with NVRTC's log when the source does not compile.
std::string nvrtc_compile(const std::string& source, const std::string& program_name, const NvrtcTarget& target,
                          const std::vector<std::string>& options);

// A module loaded into the calling thread's current CUDA context (the caller makes the device's
// primary context current first), with its kernels by name. Never unloaded: a few kernels, kept
// for the process's life, as LibTorch's jiterator keeps its own.
class CudaModule {
 public:
  explicit CudaModule(const std::string& binary);
  void* kernel(const char* name) const;  // a CUfunction; throws when the module has no such kernel
 private:
  void* module_ = nullptr;  // CUmodule
};

// Launches `kernel` on `stream` (a CUstream, e.g. a c10::cuda::CUDAStream's) with `args` (a pointer
// to each argument, as cuLaunchKernel takes them). Throws with the driver's message on failure.
void launch_kernel(void* kernel, unsigned grid_x, unsigned block_x, std::size_t shared_bytes, void* stream,
                   void** args);

// Whether the calling thread has a current CUDA context (the driver's view, not the runtime's).
bool cuda_context_current();

}  // namespace cpprun::detail
