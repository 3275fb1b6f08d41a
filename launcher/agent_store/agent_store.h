// The c10d TCPStore of a multi-node job, in libcpprun_agent_store.so, dlopen()ed on first use so
// that single-node launches never load LibTorch.
//
// Note [Agent store]
// In a static multi-node job node 0's agent hosts a real c10d TCPStore at MASTER_ADDR:MASTER_PORT
// and every worker gets TORCHELASTIC_USE_AGENT_STORE=True, so worker rank 0 connects to it instead
// of hosting one, as with torchrun's static rendezvous. The agents use it for one key: node 0
// publishes under "agent/link_port" the port where it accepts the other agents' links
// (node_link.h); the workers' keys never start with "agent/". Each round gets a fresh store,
// because our workers' keys do not name the attempt.
#pragma once

#include <chrono>
#include <optional>
#include <stdexcept>
#include <string>

struct cpprun_agent_store;

namespace cpprun::launcher {

// The store could not be loaded, started, reached or read. The message says which and why.
class AgentStoreError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class AgentStore {
 public:
  // Starts the server on `port` and connects to it over the loopback. The server listens at
  // `loopback_address` alone ("127.0.0.1", "::1") when given (every node on this host), else on
  // every interface.
  static AgentStore host(int port, const std::optional<std::string>& loopback_address,
                         std::chrono::milliseconds timeout) {
    return open(loopback_address.value_or("127.0.0.1"), port, true, loopback_address.has_value(), timeout);
  }
  // Connects to a store that another agent hosts.
  static AgentStore connect(const std::string& host, int port, std::chrono::milliseconds timeout) {
    return open(host, port, false, false, timeout);
  }

  // Loads the library now (about half a second: it brings in LibTorch), so that a later host()
  // or connect() is quick. Throws AgentStoreError.
  static void load();

  AgentStore(AgentStore&&) noexcept;
  ~AgentStore();  // a server stops and frees its port

  void set(const std::string& key, const std::string& value);
  // Waits up to the store's timeout for the key.
  std::string get(const std::string& key);

 private:
  explicit AgentStore(cpprun_agent_store* handle) : handle_(handle) {}
  static AgentStore open(const std::string& host, int port, bool is_server, bool loopback_only,
                         std::chrono::milliseconds timeout);
  cpprun_agent_store* handle_ = nullptr;
};

}  // namespace cpprun::launcher
