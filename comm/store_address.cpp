// MASTER_ADDR's resolution and rank 0's loopback listening socket. See store_address.h.
#include "comm/store_address.h"

#include <c10/util/Exception.h>

#include "cpprun/store_port.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace cpprun::detail {
namespace {

std::string where(const DistEnv& env) {
  return "MASTER_ADDR=" + env.master_addr + " MASTER_PORT=" + std::to_string(env.master_port);
}

bool is_loopback_text(const std::string& address) {
  return address.rfind("127.", 0) == 0 || address == "::1";
}

std::string address_text(const sockaddr* addr) {
  char text[INET6_ADDRSTRLEN] = {};
  const void* raw = addr->sa_family == AF_INET
                        ? static_cast<const void*>(&reinterpret_cast<const sockaddr_in*>(addr)->sin_addr)
                        : static_cast<const void*>(&reinterpret_cast<const sockaddr_in6*>(addr)->sin6_addr);
  ::inet_ntop(addr->sa_family, raw, text, sizeof text);
  return text;
}

}  // namespace

std::vector<std::string> resolve_master(const DistEnv& env) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int status = ::getaddrinfo(env.master_addr.c_str(), nullptr, &hints, &found);
  // Any failure ends it here: c10d would retry connecting until the store timeout (30 minutes
  // by default) and then report a time-out that does not name the cause. A resolver that cannot
  // be reached (EAI_AGAIN) fails too: with no resolver the name cannot resolve later either.
  TORCH_CHECK(status == 0 && found != nullptr, "cpprun: rank ", env.rank, ": MASTER_ADDR=\"",
              env.master_addr, "\" does not resolve to an address (", ::gai_strerror(status),
              "). Set MASTER_ADDR to rank 0's host name or IP address as this host can resolve "
              "it (cpprun --master_addr=HOST, or export MASTER_ADDR=HOST; `getent hosts ",
              env.master_addr, "` shows what it resolves to).");
  std::vector<std::string> addresses;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    if (a->ai_family != AF_INET && a->ai_family != AF_INET6) continue;
    std::string text = address_text(a->ai_addr);
    if (std::find(addresses.begin(), addresses.end(), text) == addresses.end()) addresses.push_back(text);
  }
  ::freeaddrinfo(found);
  TORCH_CHECK(!addresses.empty(), "cpprun: MASTER_ADDR=\"", env.master_addr,
              "\" resolves to no IPv4 or IPv6 address. Set it to rank 0's host name or IP address.");
  return addresses;
}

std::optional<std::string> store_loopback_address(const DistEnv& env,
                                                  const std::vector<std::string>& resolved) {
  const bool all_loopback = std::all_of(resolved.begin(), resolved.end(), is_loopback_text);
  const bool literal = env.master_addr == "localhost" || is_loopback_text(env.master_addr);
  // A name that resolves to loopback here (Debian maps the host name to 127.0.1.1) may resolve
  // to a routable address on other nodes: only a job on this node alone can be sure.
  if (!all_loopback || !(literal || env.world_size == env.local_world_size)) return std::nullopt;
  // IPv4 first where there is one: "localhost" clients try each address it resolves to.
  for (const auto& address : resolved) {
    if (address.find(':') == std::string::npos) return address;
  }
  return resolved.front();
}

void throw_port_in_use(const DistEnv& env, const std::string& detail) {
  TORCH_CHECK(false, "cpprun: rank 0 cannot start the rendezvous store: port ", env.master_port,
              " is already in use on this host (", where(env), "). Another job, or a previous "
              "run still shutting down, holds it. Pick a free port with `cpprun --master_port=PORT` "
              "(or `--standalone`), or export MASTER_PORT=PORT.\n", detail);
}

int listen_on(const std::string& address, int port, const DistEnv& env) {
  const StoreListen listen = listen_for_store(address, port);
  if (listen.port_in_use()) {
    throw_port_in_use(env, "bind(" + address + ":" + std::to_string(port) + "): " + std::strerror(listen.error));
  }
  TORCH_CHECK(listen.fd >= 0, "cpprun: rank 0 could not listen on ", address, ":", port, " for the "
              "rendezvous store (", where(env), "): ", std::strerror(listen.error));
  return listen.fd;
}

}  // namespace cpprun::detail
