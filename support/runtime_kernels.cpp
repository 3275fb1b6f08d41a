// See support/runtime_kernels.h. The entry points are looked up once, on first use, and kept.
#include "support/runtime_kernels.h"

#include <dlfcn.h>
#include <link.h>

#include <algorithm>
#include <filesystem>
#include <stdexcept>
#include <string_view>
#include <utility>

namespace cpprun::detail {
namespace {

// The C ABI of the few entry points used: handles are pointers, results are int enums (0: success).
using CreateProgramFn = int (*)(void** program, const char* source, const char* name, int header_count,
                                const char* const* headers, const char* const* include_names);
using CompileProgramFn = int (*)(void* program, int option_count, const char* const* options);
using SizeFn = int (*)(void* program, std::size_t* size);
using BytesFn = int (*)(void* program, char* bytes);
using DestroyProgramFn = int (*)(void** program);
using NvrtcErrorStringFn = const char* (*)(int result);
using ArchCountFn = int (*)(int* count);
using ArchListFn = int (*)(int* archs);

using ModuleLoadDataFn = int (*)(void** module, const void* image);
using ModuleGetFunctionFn = int (*)(void** function, void* module, const char* name);
using LaunchKernelFn = int (*)(void* function, unsigned grid_x, unsigned grid_y, unsigned grid_z, unsigned block_x,
                               unsigned block_y, unsigned block_z, unsigned shared_bytes, void* stream, void** params,
                               void** extra);
using DriverErrorStringFn = int (*)(int result, const char** text);
using CtxGetCurrentFn = int (*)(void** context);

struct Nvrtc {
  CreateProgramFn create_program;
  CompileProgramFn compile_program;
  SizeFn log_size, cubin_size, ptx_size;
  BytesFn log, cubin, ptx;
  DestroyProgramFn destroy_program;
  NvrtcErrorStringFn error_string;
  ArchCountFn arch_count;
  ArchListFn arch_list;
};

struct Driver {
  ModuleLoadDataFn module_load_data;
  ModuleGetFunctionFn module_get_function;
  LaunchKernelFn launch_kernel;
  DriverErrorStringFn error_string;
  CtxGetCurrentFn ctx_get_current;
};

template <typename Fn>
Fn symbol(void* library, const char* name, const std::string& library_name) {
  void* address = dlsym(library, name);
  if (!address) throw std::runtime_error("cpprun: " + library_name + " has no " + name + " (a CUDA older than 11.2?)");
  return reinterpret_cast<Fn>(address);
}

// The paths of the libraries loaded in this process.
std::vector<std::string> loaded_libraries() {
  std::vector<std::string> paths;
  dl_iterate_phdr(
      [](dl_phdr_info* info, std::size_t, void* data) {
        if (info->dlpi_name && *info->dlpi_name) static_cast<std::vector<std::string>*>(data)->push_back(info->dlpi_name);
        return 0;
      },
      &paths);
  return paths;
}

std::string file_name(const std::string& path) { return std::filesystem::path(path).filename().string(); }

// NVRTC: already in the process when LibTorch's CUDA library needs it (2.15's does); else beside
// that library in the pip wheel's layout (site-packages/nvidia/*/lib, torch/lib/../../nvidia), else
// wherever the loader finds its usual names.
void* open_nvrtc(std::string& tried) {
  std::string torch_cuda_dir;
  for (const auto& path : loaded_libraries()) {
    const auto name = file_name(path);
    if (name.starts_with("libnvrtc.so")) {
      if (void* library = dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD)) return library;
    }
    if (name.starts_with("libtorch_cuda.so")) torch_cuda_dir = std::filesystem::path(path).parent_path().string();
  }
  tried = "no libnvrtc.so* loaded in this process";
  std::vector<std::string> candidates;
  std::error_code error;
  if (!torch_cuda_dir.empty()) {
    const auto nvidia = std::filesystem::path(torch_cuda_dir) / ".." / ".." / "nvidia";
    for (const auto& package : std::filesystem::directory_iterator(nvidia, error)) {
      for (const auto& file : std::filesystem::directory_iterator(package.path() / "lib", error)) {
        const auto name = file.path().filename().string();
        if (name.starts_with("libnvrtc.so")) candidates.push_back(file.path().string());
      }
    }
    // By file name, newest first: libnvrtc.so.13 before libnvrtc.so.12, whichever folder holds it.
    std::sort(candidates.begin(), candidates.end(),
              [](const std::string& a, const std::string& b) { return file_name(a) > file_name(b); });
  }
  for (const char* name : {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"}) candidates.emplace_back(name);
  for (const auto& candidate : candidates) {
    if (void* library = dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL)) return library;
    tried += ", " + candidate;
  }
  return nullptr;
}

const Nvrtc& nvrtc() {
  static const Nvrtc loaded = [] {
    std::string tried;
    void* library = open_nvrtc(tried);
    if (!library) {
      throw std::runtime_error("cpprun: NVRTC, CUDA's runtime compiler, was not found (" + tried +
                               "); cpprun compiles its CUDA kernels with it. LibTorch's CUDA builds carry it "
                               "(pip: site-packages/nvidia/*/lib/libnvrtc.so.*): put its folder on LD_LIBRARY_PATH");
    }
    const std::string name = "NVRTC";
    return Nvrtc{symbol<CreateProgramFn>(library, "nvrtcCreateProgram", name),
                 symbol<CompileProgramFn>(library, "nvrtcCompileProgram", name),
                 symbol<SizeFn>(library, "nvrtcGetProgramLogSize", name),
                 symbol<SizeFn>(library, "nvrtcGetCUBINSize", name),
                 symbol<SizeFn>(library, "nvrtcGetPTXSize", name),
                 symbol<BytesFn>(library, "nvrtcGetProgramLog", name),
                 symbol<BytesFn>(library, "nvrtcGetCUBIN", name),
                 symbol<BytesFn>(library, "nvrtcGetPTX", name),
                 symbol<DestroyProgramFn>(library, "nvrtcDestroyProgram", name),
                 symbol<NvrtcErrorStringFn>(library, "nvrtcGetErrorString", name),
                 symbol<ArchCountFn>(library, "nvrtcGetNumSupportedArchs", name),
                 symbol<ArchListFn>(library, "nvrtcGetSupportedArchs", name)};
  }();
  return loaded;
}

// The driver exists only where a GPU does; LibTorch's CUDA runtime has loaded it by the time a
// CUDA tensor exists.
const Driver& driver() {
  static const Driver loaded = [] {
    void* library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!library) {
      throw std::runtime_error(std::string("cpprun: the CUDA driver (libcuda.so.1) could not be loaded: ") + dlerror());
    }
    const std::string name = "the CUDA driver";
    return Driver{symbol<ModuleLoadDataFn>(library, "cuModuleLoadData", name),
                  symbol<ModuleGetFunctionFn>(library, "cuModuleGetFunction", name),
                  symbol<LaunchKernelFn>(library, "cuLaunchKernel", name),
                  symbol<DriverErrorStringFn>(library, "cuGetErrorString", name),
                  symbol<CtxGetCurrentFn>(library, "cuCtxGetCurrent", name)};
  }();
  return loaded;
}

void check_nvrtc(int result, const char* what) {
  if (result != 0) throw std::runtime_error(std::string("cpprun: NVRTC's ") + what + " failed: " + nvrtc().error_string(result));
}

void check_driver(int result, const std::string& what) {
  if (result == 0) return;
  const char* text = nullptr;
  driver().error_string(result, &text);
  throw std::runtime_error("cpprun: the CUDA driver's " + what + " failed: " + (text ? text : "error " + std::to_string(result)));
}

std::string arch_text(int arch) { return std::to_string(arch / 10) + "." + std::to_string(arch % 10); }

}  // namespace

NvrtcTarget nvrtc_target(int device_arch, const std::vector<int>& supported_archs) {
  if (supported_archs.empty()) throw std::runtime_error("cpprun: NVRTC lists no GPU architecture it compiles for");
  const auto [oldest, newest] = std::minmax_element(supported_archs.begin(), supported_archs.end());
  if (std::find(supported_archs.begin(), supported_archs.end(), device_arch) != supported_archs.end()) {
    return {"--gpu-architecture=sm_" + std::to_string(device_arch), true};
  }
  if (device_arch > *newest) {
    // A newer device than this NVRTC knows: PTX of the newest it knows, which the driver compiles on.
    return {"--gpu-architecture=compute_" + std::to_string(*newest), false};
  }
  if (device_arch < *oldest) {
    throw std::runtime_error("cpprun: this GPU's architecture " + arch_text(device_arch) +
                             " is older than any this NVRTC compiles for (" + arch_text(*oldest) + " to " +
                             arch_text(*newest) + "); a LibTorch built for older GPUs carries an NVRTC that takes it");
  }
  // Between two it lists (e.g. 8.7 on an NVRTC listing 8.6 and 8.9): PTX of the newest below it.
  int below = *oldest;
  for (int arch : supported_archs) {
    if (arch < device_arch) below = std::max(below, arch);
  }
  return {"--gpu-architecture=compute_" + std::to_string(below), false};
}

std::vector<int> nvrtc_supported_archs() {
  int count = 0;
  check_nvrtc(nvrtc().arch_count(&count), "nvrtcGetNumSupportedArchs");
  std::vector<int> archs(static_cast<std::size_t>(std::max(count, 0)));
  if (count > 0) check_nvrtc(nvrtc().arch_list(archs.data()), "nvrtcGetSupportedArchs");
  return archs;
}

std::string nvrtc_compile(const std::string& source, const std::string& program_name, const NvrtcTarget& target,
                          const std::vector<std::string>& options) {
  const Nvrtc& api = nvrtc();
  void* program = nullptr;
  check_nvrtc(api.create_program(&program, source.c_str(), program_name.c_str(), 0, nullptr, nullptr),
              "nvrtcCreateProgram");
  struct Destroy {
    const Nvrtc& api;
    void* program;
    ~Destroy() { api.destroy_program(&program); }
  } destroy{api, program};
  std::vector<const char*> argv{target.arch_option.c_str()};
  for (const auto& option : options) argv.push_back(option.c_str());
  const int compiled = api.compile_program(program, static_cast<int>(argv.size()), argv.data());
  if (compiled != 0) {
    std::size_t log_size = 0;
    api.log_size(program, &log_size);
    std::string log(log_size, '\0');
    if (log_size > 0) api.log(program, log.data());
    while (!log.empty() && (log.back() == '\0' || log.back() == '\n')) log.pop_back();
    throw std::runtime_error("cpprun: NVRTC could not compile " + program_name + " (" + target.arch_option +
                             "): " + api.error_string(compiled) + "\n" + log);
  }
  std::size_t size = 0;
  check_nvrtc(target.binary ? api.cubin_size(program, &size) : api.ptx_size(program, &size), "binary size");
  std::string binary(size, '\0');
  check_nvrtc(target.binary ? api.cubin(program, binary.data()) : api.ptx(program, binary.data()), "binary");
  return binary;
}

CudaModule::CudaModule(const std::string& binary) {
  check_driver(driver().module_load_data(&module_, binary.data()), "cuModuleLoadData");
}

void* CudaModule::kernel(const char* name) const {
  void* function = nullptr;
  check_driver(driver().module_get_function(&function, module_, name), std::string("cuModuleGetFunction(") + name + ")");
  return function;
}

void launch_kernel(void* kernel, unsigned grid_x, unsigned block_x, std::size_t shared_bytes, void* stream,
                   void** args) {
  check_driver(driver().launch_kernel(kernel, grid_x, 1, 1, block_x, 1, 1, static_cast<unsigned>(shared_bytes), stream,
                                      args, nullptr),
               "cuLaunchKernel");
}

bool cuda_context_current() {
  void* context = nullptr;
  check_driver(driver().ctx_get_current(&context), "cuCtxGetCurrent");
  return context != nullptr;
}

}  // namespace cpprun::detail
