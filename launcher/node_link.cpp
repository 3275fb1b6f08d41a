// Non-blocking sockets for the agents' links, read from the agent's poll() loop.
#include "node_link.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <system_error>

namespace cpprun::launcher {
namespace {

using Clock = std::chrono::steady_clock;

// A line longer than this is not one of our messages.
constexpr std::size_t kMaxLine = 64 * 1024;

// Notices a peer host that vanished without closing the connection (power loss, cable): probes
// after 10 s of silence, every 5 s, 4 times. Unacknowledged data gives up after 30 s.
void enable_keepalive(int fd) {
  const int on = 1;
  const int idle = 10;
  const int interval = 5;
  const int count = 4;
  const unsigned user_timeout_ms = 30000;
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count));
  setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout_ms, sizeof(user_timeout_ms));
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
}

std::string address_text(const sockaddr* address) {
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (address->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(address);
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
    port = ntohs(in->sin_port);
    return std::string(host) + ":" + std::to_string(port);
  }
  if (address->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(address);
    port = ntohs(in6->sin6_port);
    if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) {  // an IPv4 peer of our dual-stack listener
      inet_ntop(AF_INET, &in6->sin6_addr.s6_addr[12], host, sizeof(host));
      return std::string(host) + ":" + std::to_string(port);
    }
    inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
    return "[" + std::string(host) + "]:" + std::to_string(port);
  }
  return "?";
}

bool is_loopback_address(const sockaddr* address) {
  if (address->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(address);
    return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
  }
  if (address->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(address);
    if (IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr)) return true;
    return IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr) && in6->sin6_addr.s6_addr[12] == 127;
  }
  return false;
}

struct AddressList {
  addrinfo* head = nullptr;
  ~AddressList() {
    if (head != nullptr) freeaddrinfo(head);
  }
};

// getaddrinfo's error as text.
int resolve(const std::string& host, int port, AddressList& list, std::string& error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  const int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &list.head);
  if (rc != 0) error = "cannot resolve " + host + ": " + gai_strerror(rc);
  return rc;
}

}  // namespace

NodeLink::NodeLink(int fd, std::string peer) : fd_(fd), peer_(std::move(peer)) {}

NodeLink::~NodeLink() { close_fd(); }

NodeLink::NodeLink(NodeLink&& other) noexcept
    : fd_(other.fd_), peer_(std::move(other.peer_)), buffer_(std::move(other.buffer_)) {
  other.fd_ = -1;
}

NodeLink& NodeLink::operator=(NodeLink&& other) noexcept {
  if (this != &other) {
    close_fd();
    fd_ = other.fd_;
    peer_ = std::move(other.peer_);
    buffer_ = std::move(other.buffer_);
    other.fd_ = -1;
  }
  return *this;
}

void NodeLink::close_fd() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

bool NodeLink::send(const NodeMessage& message) {
  if (fd_ < 0) return false;
  const std::string line = encode_message(message) + "\n";
  std::size_t sent = 0;
  while (sent < line.size()) {
    const ssize_t n = ::send(fd_, line.data() + sent, line.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<std::size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      // Messages are a few dozen bytes; a full socket buffer means the peer stopped reading.
      pollfd out{fd_, POLLOUT, 0};
      if (poll(&out, 1, 5000) <= 0) return false;
    } else {
      return false;
    }
  }
  return true;
}

NodeLink::Received NodeLink::receive() {
  Received got;
  if (fd_ < 0) {
    got.closed = true;
    return got;
  }
  char chunk[4096];
  for (;;) {
    const ssize_t n = recv(fd_, chunk, sizeof(chunk), 0);
    if (n > 0) {
      buffer_.append(chunk, static_cast<std::size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    got.closed = true;  // 0: orderly close; else ECONNRESET, ETIMEDOUT (keep-alive), ...
    break;
  }
  std::size_t start = 0;
  for (std::size_t end; (end = buffer_.find('\n', start)) != std::string::npos; start = end + 1) {
    const std::string line = buffer_.substr(start, end - start);
    std::optional<NodeMessage> message = decode_message(line);
    if (!message) {
      got.bad_line = line.substr(0, 200);
      got.closed = true;
      break;
    }
    got.messages.push_back(std::move(*message));
  }
  buffer_.erase(0, start);
  if (got.bad_line.empty() && buffer_.size() > kMaxLine) {
    got.bad_line = buffer_.substr(0, 200);
    got.closed = true;
  }
  if (got.closed) close_fd();
  return got;
}

LinkListener::LinkListener(bool loopback_only) {
  // IPv6 with IPV6_V6ONLY off takes IPv4 too; a host without IPv6 gets an IPv4 socket.
  fd_ = socket(AF_INET6, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int rc = -1;
  if (fd_ >= 0) {
    const int off = 0;
    setsockopt(fd_, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof(off));
    sockaddr_in6 address{};
    address.sin6_family = AF_INET6;
    if (loopback_only) {
      inet_pton(AF_INET6, "::ffff:127.0.0.1", &address.sin6_addr);
    } else {
      address.sin6_addr = in6addr_any;
    }
    rc = bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address));
    if (rc != 0) {
      close(fd_);
      fd_ = -1;
    }
  }
  if (fd_ < 0) {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd_ < 0) throw std::system_error(errno, std::generic_category(), "cpprun: socket() for the agents' links");
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(loopback_only ? INADDR_LOOPBACK : INADDR_ANY);
    rc = bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address));
  }
  if (rc != 0 || listen(fd_, 128) != 0) {
    const int error = errno;
    close(fd_);
    throw std::system_error(error, std::generic_category(), "cpprun: listening for the other nodes' agents");
  }
  sockaddr_storage bound{};
  socklen_t size = sizeof(bound);
  getsockname(fd_, reinterpret_cast<sockaddr*>(&bound), &size);
  port_ = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                      : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
}

LinkListener::~LinkListener() {
  if (fd_ >= 0) close(fd_);
}

LinkListener::LinkListener(LinkListener&& other) noexcept : fd_(other.fd_), port_(other.port_) { other.fd_ = -1; }

LinkListener& LinkListener::operator=(LinkListener&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) close(fd_);
    fd_ = other.fd_;
    port_ = other.port_;
    other.fd_ = -1;
  }
  return *this;
}

EndpointListener LinkListener::at_endpoint(const std::string& host, int port) {
  EndpointListener result;
  AddressList addresses;
  if (resolve(host, port, addresses, result.error) != 0) return result;
  result.status = ListenStatus::kNotHere;
  for (const addrinfo* a = addresses.head; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    // A previous job's connections in TIME_WAIT must not keep the endpoint from being hosted again;
    // a listening socket still refuses a second listener, which is what decides the host.
    const int on = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
    if (a->ai_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &on, sizeof(on));
    int error = 0;
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 128) != 0) error = errno;
    if (error == 0) {
      result.status = ListenStatus::kListening;
      result.listener.emplace(LinkListener(fd, port));
      result.error.clear();
      return result;
    }
    close(fd);
    if (error == EADDRINUSE) {
      result.status = ListenStatus::kTaken;
      return result;
    }
    if (error != EADDRNOTAVAIL) {
      result.status = ListenStatus::kFailed;
      result.error = "cannot listen at " + address_text(a->ai_addr) + ": " + std::strerror(error);
      return result;
    }
  }
  return result;
}

std::optional<NodeLink> LinkListener::accept() {
  sockaddr_storage peer{};
  socklen_t size = sizeof(peer);
  int fd = -1;
  do {
    fd = accept4(fd_, reinterpret_cast<sockaddr*>(&peer), &size, SOCK_NONBLOCK | SOCK_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return std::nullopt;  // nothing waiting, or it went away already
  enable_keepalive(fd);
  return NodeLink(fd, address_text(reinterpret_cast<sockaddr*>(&peer)));
}

ConnectResult connect_link(const std::string& host, int port, std::chrono::milliseconds timeout, int wake_fd) {
  ConnectResult result;
  AddressList addresses;
  if (resolve(host, port, addresses, result.error) != 0) return result;
  const auto deadline = Clock::now() + timeout;
  for (const addrinfo* a = addresses.head; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      result.error = std::string("socket(): ") + std::strerror(errno);
      continue;
    }
    const std::string where = address_text(a->ai_addr);
    int error = 0;
    if (connect(fd, a->ai_addr, a->ai_addrlen) != 0) error = errno;
    if (error == EINPROGRESS) {
      pollfd fds[2] = {{fd, POLLOUT, 0}, {wake_fd, POLLIN, 0}};
      for (;;) {
        const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
        const int ready = poll(fds, wake_fd >= 0 ? 2 : 1, static_cast<int>(std::max<long long>(left, 0)));
        if (ready < 0 && errno == EINTR) continue;
        if (ready > 0 && wake_fd >= 0 && (fds[1].revents & POLLIN) != 0) {
          close(fd);
          result.status = ConnectStatus::kInterrupted;
          return result;
        }
        if (ready <= 0) {
          error = ETIMEDOUT;
        } else {
          socklen_t size = sizeof(error);
          getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &size);
        }
        break;
      }
    }
    if (error == 0) {
      enable_keepalive(fd);
      result.status = ConnectStatus::kConnected;
      result.link.emplace(fd, where);
      result.error.clear();
      return result;
    }
    close(fd);
    result.error = where + ": " + std::strerror(error);
    if (Clock::now() >= deadline) break;
  }
  return result;
}

bool is_loopback_host(const std::string& host) {
  AddressList addresses;
  std::string error;
  if (resolve(host, 0, addresses, error) != 0) return false;
  for (const addrinfo* a = addresses.head; a != nullptr; a = a->ai_next) {
    if (!is_loopback_address(a->ai_addr)) return false;
  }
  return addresses.head != nullptr;
}

}  // namespace cpprun::launcher
