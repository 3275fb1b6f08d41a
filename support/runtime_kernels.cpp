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
        if (info->dlpi_name && *info->dlpi_name) {
          static_cast<std::vector<std::string>*>(data)->push_back(info->dlpi_name);
        }
        return 0;
      },
      &paths);
  return paths;
}

std::string file_name(const std::string& path) { return std::filesystem::path(path).filename().string(); }

// Adds the paths of the files in `folder`; none when it cannot be read (a folder that is not
// there is the common case), never an exception.
void list_folder(const std::filesystem::path& folder, std::vector<std::string>& paths) {
  std::error_code error;
  for (std::filesystem::directory_iterator it(folder, error), end; !error && it != end; it.increment(error)) {
    paths.push_back(it->path().string());
  }
}

// NVRTC: already in the process when LibTorch's CUDA library needs it (2.15's does); else beside
// that library (LibTorch's zip: lib/libnvrtc-HASH.so.N) or in the pip wheel's layout
// (site-packages/nvidia/*/lib, torch/lib/../../nvidia); else wherever the loader finds its usual
// names. The CUDA runtime's major version first: an NVRTC newer than the runtime LibTorch was
// built with may emit what the machine's driver cannot load.
void* open_nvrtc(std::string& tried) {
  const std::vector<std::string> loaded = loaded_libraries();
  const int cuda_major = cuda_runtime_major(loaded);
  for (const auto& path : nvrtc_libraries_in_order(loaded, cuda_major)) {
    if (void* library = dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD)) return library;
  }
  tried = "none loaded in this process";
  std::vector<std::string> files;
  for (const auto& path : loaded) {
    if (!file_name(path).starts_with("libtorch_cuda.so")) continue;
    const auto torch_lib = std::filesystem::path(path).parent_path();
    list_folder(torch_lib, files);
    std::vector<std::string> packages;
    list_folder(torch_lib / ".." / ".." / "nvidia", packages);
    for (const auto& package : packages) list_folder(std::filesystem::path(package) / "lib", files);
    break;
  }
  std::vector<std::string> candidates = nvrtc_libraries_in_order(files, cuda_major);
  if (cuda_major > 0) candidates.push_back("libnvrtc.so." + std::to_string(cuda_major));
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
  if (result != 0) {
    throw std::runtime_error(std::string("cpprun: NVRTC's ") + what + " failed: " + nvrtc().error_string(result));
  }
}

void check_driver(int result, const std::string& what) {
  if (result == 0) return;
  const char* text = nullptr;
  driver().error_string(result, &text);
  throw std::runtime_error("cpprun: the CUDA driver's " + what +
                           " failed: " + (text ? text : "error " + std::to_string(result)));
}

std::string arch_text(int arch) { return std::to_string(arch / 10) + "." + std::to_string(arch % 10); }

// The major version after ".so." in a library's file name (libnvrtc.so.13.0.48 -> 13), else -1.
int so_major_version(const std::string& name) {
  const auto at = name.find(".so.");
  if (at == std::string::npos) return -1;
  int version = -1;
  for (std::size_t i = at + 4; i < name.size() && i < at + 10 && name[i] >= '0' && name[i] <= '9'; ++i) {
    version = std::max(version, 0) * 10 + (name[i] - '0');  // six digits at most: no overflow
  }
  return version;
}

}  // namespace

bool is_nvrtc_library(const std::string& library_file) {
  const std::string_view name(library_file);
  if (!name.starts_with("libnvrtc")) return false;
  const std::string_view rest = name.substr(8);
  if (rest == ".so" || rest.starts_with(".so.")) return true;
  if (!rest.starts_with("-") || rest.starts_with("-builtins")) return false;
  // libnvrtc-HASH.so.N: a hash of letters and digits, then the library suffix.
  const auto suffix = rest.find(".so");
  if (suffix == std::string_view::npos || suffix == 1) return false;
  const std::string_view hash = rest.substr(1, suffix - 1);
  const bool alphanumeric = std::all_of(hash.begin(), hash.end(), [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
  });
  const std::string_view after = rest.substr(suffix);
  return alphanumeric && (after == ".so" || after.starts_with(".so."));
}

int cuda_runtime_major(const std::vector<std::string>& paths) {
  for (const auto& path : paths) {
    const std::string name = file_name(path);
    const bool hashed = name.starts_with("libcudart-") && name.find(".so.") != std::string::npos;  // the zip's
    if (name.starts_with("libcudart.so.") || hashed) return so_major_version(name);
  }
  return -1;
}

std::vector<std::string> nvrtc_libraries_in_order(const std::vector<std::string>& paths, int cuda_major) {
  std::vector<std::string> found;
  for (const auto& path : paths) {
    if (is_nvrtc_library(file_name(path))) found.push_back(path);
  }
  // (the runtime's major first, then the newest); std::pair compares the first, then the second.
  auto rank = [cuda_major](const std::string& path) {
    const int major = so_major_version(file_name(path));
    return std::pair<bool, int>(cuda_major < 0 || major != cuda_major, -major);
  };
  std::stable_sort(found.begin(), found.end(),
                   [&rank](const std::string& a, const std::string& b) { return rank(a) < rank(b); });
  return found;
}

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
    // LibTorch's zip ships NVRTC's builtins renamed (lib/libnvrtc-builtins-HASH.so.X.Y), under a
    // name NVRTC does not look for (pytorch/pytorch#99781).
    const std::string builtins_hint =
        log.find("libnvrtc-builtins") == std::string::npos
            ? ""
            : "\nNVRTC loads its builtins library by the name above; where it is there under another name "
              "(LibTorch's zip: lib/libnvrtc-builtins-HASH.so.X.Y), a link by that name beside it fixes this "
              "(ln -s libnvrtc-builtins-HASH.so.X.Y libnvrtc-builtins.so.X.Y), as does a CUDA toolkit's lib64 "
              "on LD_LIBRARY_PATH";
    throw std::runtime_error("cpprun: NVRTC could not compile " + program_name + " (" + target.arch_option +
                             "): " + api.error_string(compiled) + "\n" + log + builtins_hint);
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
  check_driver(driver().module_get_function(&function, module_, name),
               std::string("cuModuleGetFunction(") + name + ")");
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
