// The port a c10d TCPStore server listens on: bound by us where c10d's own choice (every interface)
// is wrong, and recognised as taken whoever tried it (comm/store_address.cpp, comm/process_group.cpp).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <string>

namespace cpprun {

// A listening socket, or why there is none.
struct StoreListen {
  int fd = -1;     // for c10d::TCPStoreOptions::masterListenFd (the store takes it over)
  int error = 0;   // errno of socket(), bind() or listen() when fd < 0
  bool port_in_use() const { return error == EADDRINUSE; }
};

// A TCP socket bound to `address` (a numeric IPv4 or IPv6 address, e.g. "127.0.0.1", "::1") and
// `port`, listening. SO_REUSEADDR as c10d's own server socket: a port left in TIME_WAIT by a
// finished job can be reused, while one another process listens on still fails (port_in_use()).
inline StoreListen listen_for_store(const std::string& address, int port) {
  sockaddr_storage storage{};
  socklen_t length = 0;
  if (address.find(':') == std::string::npos) {
    auto* in = reinterpret_cast<sockaddr_in*>(&storage);
    in->sin_family = AF_INET;
    in->sin_port = htons(static_cast<std::uint16_t>(port));
    if (inet_pton(AF_INET, address.c_str(), &in->sin_addr) != 1) return {-1, EINVAL};
    length = sizeof(sockaddr_in);
  } else {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&storage);
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons(static_cast<std::uint16_t>(port));
    if (inet_pton(AF_INET6, address.c_str(), &in6->sin6_addr) != 1) return {-1, EINVAL};
    length = sizeof(sockaddr_in6);
  }
  const int fd = socket(storage.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return {-1, errno};
  const int on = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
  if (bind(fd, reinterpret_cast<const sockaddr*>(&storage), length) != 0 || listen(fd, SOMAXCONN) != 0) {
    const int error = errno;
    close(fd);
    return {-1, error};
  }
  return {fd, 0};
}

// c10d's TCPStore says that its server's port is taken only in its message's text.
inline bool reports_port_in_use(const std::string& c10d_message) {
  return c10d_message.find("in use") != std::string::npos || c10d_message.find("EADDRINUSE") != std::string::npos;
}

}  // namespace cpprun
