// dlopen() of libcpprun_agent_store.so on first use; see Note [Agent store].
#include "agent_store/agent_store.h"

#include <dlfcn.h>
#include <unistd.h>

#include <array>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "agent_store/agent_store_abi.h"

#ifndef CPPRUN_AGENT_STORE_RELATIVE_DIR
#define CPPRUN_AGENT_STORE_RELATIVE_DIR "../lib/cpprun"
#endif

namespace cpprun::launcher {
namespace {

constexpr const char* kLibraryName = "libcpprun_agent_store.so";

// Next to this executable (the build tree), else where `cmake --install` puts it relative to it.
std::string find_library() {
  std::error_code error;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", error);
  const std::string dir = error ? "." : exe.parent_path().string();
  const std::vector<std::string> candidates = {dir + "/" + kLibraryName,
                                               dir + "/" CPPRUN_AGENT_STORE_RELATIVE_DIR "/" + kLibraryName};
  for (const std::string& path : candidates) {
    if (access(path.c_str(), R_OK) == 0) return path;
  }
  throw AgentStoreError(std::string("cpprun: a multi-node job (--nnodes > 1) needs ") + kLibraryName +
                        ", cpprun's LibTorch part, to host the c10d store; it is not in " + candidates[0] +
                        " nor " + candidates[1] + ". Build the cpprun_agent_store target, or reinstall cpprun.");
}

const cpprun_agent_store_api& load_library() {
  const std::string path = find_library();
  // c10d logs through glog, which would repeat our own errors with a warning that it was never
  // initialised. glog reads its level when it is loaded; a level the user set wins.
  const bool user_level = std::getenv("GLOG_minloglevel") != nullptr;
  if (!user_level) setenv("GLOG_minloglevel", "3", 1);
  void* library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!user_level) unsetenv("GLOG_minloglevel");
  if (library == nullptr) {
    throw AgentStoreError(std::string("cpprun: a multi-node job (--nnodes > 1) needs ") + kLibraryName +
                          ", cpprun's LibTorch part, to host the c10d store; loading it failed: " + dlerror() +
                          ". Is LibTorch installed where it was when cpprun was built?");
  }
  const auto get_api = reinterpret_cast<decltype(&cpprun_agent_store_get_api)>(
      dlsym(library, "cpprun_agent_store_get_api"));
  const cpprun_agent_store_api* api = get_api != nullptr ? get_api() : nullptr;
  if (api == nullptr || api->abi_version != CPPRUN_AGENT_STORE_ABI_VERSION) {
    const std::string found = api == nullptr ? "no interface" : "interface version " + std::to_string(api->abi_version);
    throw AgentStoreError("cpprun: " + path + " has " + found + ", this cpprun needs interface version " +
                          std::to_string(CPPRUN_AGENT_STORE_ABI_VERSION) +
                          ": it belongs to another cpprun build. Rebuild or reinstall cpprun.");
  }
  return *api;
}

// Loaded once, kept for the life of the process (c10d's threads live in it). A failure is kept
// too: loading again would set GLOG_minloglevel again, with other threads running.
const cpprun_agent_store_api& api() {
  static std::string failure;
  static const cpprun_agent_store_api* const loaded = []() -> const cpprun_agent_store_api* {
    try {
      return &load_library();
    } catch (const AgentStoreError& e) {
      failure = e.what();
      return nullptr;
    }
  }();
  if (loaded == nullptr) throw AgentStoreError(failure);
  return *loaded;
}

}  // namespace

AgentStore AgentStore::open(const std::string& host, int port, bool is_server, bool loopback_only,
                            std::chrono::milliseconds timeout) {
  std::array<char, 1024> err{};
  cpprun_agent_store* handle = api().open(host.c_str(), port, is_server ? 1 : 0, loopback_only ? 1 : 0,
                                          static_cast<long>(timeout.count()), err.data(), err.size());
  if (handle == nullptr) throw AgentStoreError(err.data());
  return AgentStore(handle);
}

void AgentStore::load() { api(); }

AgentStore::AgentStore(AgentStore&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}

AgentStore::~AgentStore() {
  if (handle_ != nullptr) api().close(handle_);
}

void AgentStore::set(const std::string& key, const std::string& value) {
  std::array<char, 1024> err{};
  if (api().set(handle_, key.c_str(), value.c_str(), err.data(), err.size()) != 0) {
    throw AgentStoreError("cpprun: setting " + key + " in the agent store failed: " + err.data());
  }
}

std::string AgentStore::get(const std::string& key) {
  std::array<char, 1024> err{};
  std::array<char, 4096> value{};
  if (api().get(handle_, key.c_str(), value.data(), value.size(), err.data(), err.size()) != 0) {
    throw AgentStoreError(err.data());
  }
  return value.data();
}

}  // namespace cpprun::launcher
