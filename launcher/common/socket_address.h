// A numeric IPv4 or IPv6 address and a port as the sockaddr bind() and connect() take, and the port
// a bound socket got: what the store keeper's listener, the store tunnel's loopback ends and the
// agents' link listener each needed.
#pragma once

#include <sys/socket.h>

#include <optional>
#include <string>

namespace cpprun::launcher {

struct SocketAddress {
  sockaddr_storage storage{};
  socklen_t size = 0;
};

// `address` with a ':' is IPv6, else IPv4; nullopt when it is not a numeric address of that family.
std::optional<SocketAddress> socket_address(const std::string& address, int port);

// The port `fd` is bound to (the kernel's pick after a bind to port 0); 0 when getsockname fails.
int bound_port(int fd);

}  // namespace cpprun::launcher
