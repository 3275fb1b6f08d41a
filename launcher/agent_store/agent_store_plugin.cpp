// libcpprun_agent_store.so: a c10d TCPStore behind the C interface of agent_store_abi.h. The only
// launcher code that links LibTorch; see Note [Agent store] in agent_store.h.
#include "agent_store_abi.h"
#include "cpprun/store_port.h"

#include <fcntl.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <chrono>
#include <cstring>
#include <exception>
#include <filesystem>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

struct cpprun_agent_store {
  std::unique_ptr<c10d::TCPStore> store;
};

namespace {

void put_error(char* err, size_t err_size, const std::string& message) {
  if (err == nullptr || err_size == 0) return;
  std::strncpy(err, message.c_str(), err_size - 1);
  err[err_size - 1] = '\0';
}

std::set<int> open_fds() {
  std::set<int> fds;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    fds.insert(std::stoi(entry.path().filename().string()));
  }
  return fds;
}

// c10d's sockets lack close-on-exec: a worker (or its leftover) holding the listening socket would keep
// the port bound after the agent closed the store, and the next round could not bind it again.
void set_cloexec_on_new(const std::set<int>& before) {
  for (int fd : open_fds()) {
    if (before.count(fd) == 0) fcntl(fd, F_SETFD, FD_CLOEXEC);  // the only descriptor flag there is
  }
}

// Runs `body`; false, with the exception's first line in `err`, if it threw: none may cross the C ABI.
template <typename Body>
bool guarded(char* err, size_t err_size, const Body& body) {
  try {
    body();
    return true;
  } catch (const std::exception& e) {
    // c10d's exception texts end with a C++ backtrace in some builds; the first line says it all.
    const std::string what = e.what();
    put_error(err, err_size, what.substr(0, what.find('\n')));
  } catch (...) {
    put_error(err, err_size, "unknown error");
  }
  return false;
}

cpprun_agent_store* open_store(const char* host, int port, int is_server, int loopback_only, long timeout_ms,
                               char* err, size_t err_size) {
  cpprun_agent_store* opened = nullptr;
  guarded(err, err_size, [&] {
    c10d::TCPStoreOptions opts;
    opts.port = static_cast<std::uint16_t>(port);
    opts.isServer = is_server != 0;
    opts.waitWorkers = false;  // the agents' own rendezvous counts the nodes
    opts.timeout = std::chrono::milliseconds(timeout_ms);
    // c10d binds its server to every interface; a job whose nodes are all on this host needs only
    // the loopback, where nobody on the network reaches its store. We bind and hand the socket over.
    // `host` is then the numeric loopback address the other nodes know node 0 by (::1 or 127.x).
    if (is_server != 0 && loopback_only != 0) {
      const cpprun::StoreListen listen = cpprun::listen_for_store(host, port);
      if (listen.fd < 0) {
        throw std::runtime_error("cannot listen at " + std::string(host) + " port " + std::to_string(port) + ": " +
                                 std::strerror(listen.error) +
                                 (listen.port_in_use() ? " (EADDRINUSE: port in use)" : ""));
      }
      opts.masterListenFd = listen.fd;
    }
    const std::set<int> before = open_fds();
    auto handle = std::make_unique<cpprun_agent_store>();
    handle->store = std::make_unique<c10d::TCPStore>(host, opts);
    set_cloexec_on_new(before);
    opened = handle.release();
  });
  return opened;
}

int set_key(cpprun_agent_store* store, const char* key, const char* value, char* err, size_t err_size) {
  const auto set = [&] { store->store->set(key, std::vector<uint8_t>(value, value + std::strlen(value))); };
  return guarded(err, err_size, set) ? 0 : -1;
}

int get_key(cpprun_agent_store* store, const char* key, char* value, size_t value_size, char* err, size_t err_size) {
  return guarded(err, err_size, [&] {
    const std::vector<uint8_t> bytes = store->store->get(key);
    put_error(value, value_size, std::string(bytes.begin(), bytes.end()));
  }) ? 0 : -1;
}

void close_store(cpprun_agent_store* store) { delete store; }  // destructors do not throw

}  // namespace

extern "C" const cpprun_agent_store_api* cpprun_agent_store_get_api(void) {
  static const cpprun_agent_store_api api{CPPRUN_AGENT_STORE_ABI_VERSION, open_store, set_key, get_key, close_store};
  return &api;
}
