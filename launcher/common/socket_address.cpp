// See socket_address.h.
#include "common/socket_address.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstdint>

namespace cpprun::launcher {

std::optional<SocketAddress> socket_address(const std::string& address, int port) {
  SocketAddress a;
  const auto network_port = htons(static_cast<std::uint16_t>(port));
  if (address.find(':') == std::string::npos) {
    auto* in = reinterpret_cast<sockaddr_in*>(&a.storage);
    in->sin_family = AF_INET;
    in->sin_port = network_port;
    if (inet_pton(AF_INET, address.c_str(), &in->sin_addr) != 1) return std::nullopt;
    a.size = sizeof(sockaddr_in);
  } else {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&a.storage);
    in6->sin6_family = AF_INET6;
    in6->sin6_port = network_port;
    if (inet_pton(AF_INET6, address.c_str(), &in6->sin6_addr) != 1) return std::nullopt;
    a.size = sizeof(sockaddr_in6);
  }
  return a;
}

int bound_port(int fd) {
  sockaddr_storage bound{};
  socklen_t size = sizeof(bound);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &size) != 0) return 0;
  return ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                           : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
}

}  // namespace cpprun::launcher
