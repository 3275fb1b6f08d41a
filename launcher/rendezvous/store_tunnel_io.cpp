// The store tunnel's sockets: see store_tunnel_io.h.
#include "rendezvous/store_tunnel_io.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <iostream>
#include <system_error>
#include <optional>
#include <utility>

#include "common/socket_address.h"

namespace cpprun::launcher {
namespace {

using Kind = TunnelAction::Kind;

constexpr std::chrono::milliseconds kFirstRetry{50};
constexpr std::chrono::milliseconds kLastRetry{1000};
// How long a member's listener rests after accept4 ran out of descriptors.
constexpr std::chrono::milliseconds kAcceptPause{100};

bool out_of_descriptors(int error) { return error == EMFILE || error == ENFILE; }

// One of our loopback literals ("127.0.0.1", "::1") and a port.
SocketAddress loopback_address(const std::string& address, int port) {
  std::optional<SocketAddress> a = socket_address(address, port);
  if (!a) throw std::system_error(EINVAL, std::generic_category(), "'" + address + "' is no numeric address");
  return *a;
}

// A socket bound to address:port (0: the kernel picks), listening; throws
// std::system_error with bind()'s errno.
OwnedFd bind_loopback(const std::string& address, int port) {
  const SocketAddress a = loopback_address(address, port);
  OwnedFd fd(socket(a.storage.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) throw std::system_error(errno, std::generic_category(), "socket()");
  const int one = 1;
  setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(fd.get(), reinterpret_cast<const sockaddr*>(&a.storage), a.size) != 0 ||
      listen(fd.get(), SOMAXCONN) != 0) {
    throw std::system_error(errno, std::generic_category(),
                            "binding " + address + ":" + std::to_string(port) + " for the workers' store");
  }
  return fd;
}

// 127.0.0.1 (::1 first for a job that meets over IPv6), else the other where this host lacks the
// first (bind fails with EADDRNOTAVAIL).
template <typename Bind>
auto on_loopback(LoopbackFamily family, Bind bind_at) {
  const std::string first = family == LoopbackFamily::kIpv6 ? "::1" : "127.0.0.1";
  try {
    return bind_at(first);
  } catch (const std::system_error& e) {
    if (e.code().value() != EADDRNOTAVAIL && e.code().value() != EAFNOSUPPORT) throw;
  }
  return bind_at(std::string(family == LoopbackFamily::kIpv6 ? "127.0.0.1" : "::1"));
}

}  // namespace

LoopbackFamily loopback_family_for(const std::string& meeting_host) {
  return meeting_host.find(':') != std::string::npos ? LoopbackFamily::kIpv6 : LoopbackFamily::kIpv4;
}

bool connected_to_itself(int fd) {
  sockaddr_storage local{};
  sockaddr_storage peer{};
  socklen_t local_size = sizeof(local);
  socklen_t peer_size = sizeof(peer);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_size) != 0 ||
      getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_size) != 0) {
    return false;
  }
  if (local.ss_family != peer.ss_family) return false;
  if (local.ss_family == AF_INET) {
    const auto& l = reinterpret_cast<const sockaddr_in&>(local);
    const auto& p = reinterpret_cast<const sockaddr_in&>(peer);
    return l.sin_port == p.sin_port && l.sin_addr.s_addr == p.sin_addr.s_addr;
  }
  if (local.ss_family == AF_INET6) {
    const auto& l = reinterpret_cast<const sockaddr_in6&>(local);
    const auto& p = reinterpret_cast<const sockaddr_in6&>(peer);
    return l.sin6_port == p.sin6_port && std::memcmp(&l.sin6_addr, &p.sin6_addr, sizeof(in6_addr)) == 0;
  }
  return false;
}

LoopbackEndpoint free_loopback_port(LoopbackFamily family) {
  return on_loopback(family, [](const std::string& address) {
    const OwnedFd fd = bind_loopback(address, 0);
    return LoopbackEndpoint{address, bound_port(fd.get())};
  });
}

LoopbackEndpoint StoreTunnel::listen_for_round(int round, LoopbackFamily family, int preferred_port, NodeLink& link) {
  listener_.reset();
  carry_out(state_.on_round_started(round), link);  // closes the channels of the round before
  LoopbackEndpoint where = on_loopback(family, [&](const std::string& address) {
    if (preferred_port > 0) {
      try {
        OwnedFd fd = bind_loopback(address, preferred_port);
        listener_ = std::move(fd);
        return LoopbackEndpoint{address, preferred_port};
      } catch (const std::system_error& e) {
        if (e.code().value() != EADDRINUSE) throw;
      }
    }
    listener_ = bind_loopback(address, 0);
    return LoopbackEndpoint{address, bound_port(listener_.get())};
  });
  accepting_ = state_.accepting();
  accept_again_at_.reset();
  ensure_timer();
  return where;
}

void StoreTunnel::serve_round(int round, const LoopbackEndpoint& store, NodeLink& link) {
  store_ = store;
  ensure_timer();
  carry_out(state_.on_round_started(round), link);
}

void StoreTunnel::end_round(int round, NodeLink& link) {
  carry_out(state_.on_round_ended(round), link);
  listener_.reset();
}

std::string StoreTunnel::on_peer(const NodeMessage& message, NodeLink& link) {
  return carry_out(state_.on_peer(message), link);
}

void StoreTunnel::on_link_lost() {
  state_.on_link_lost();  // closes every channel: so do we, with nobody to tell
  sockets_.clear();
  listener_.reset();
  timer_.reset();
}

void StoreTunnel::on_new_link() {
  on_link_lost();
  state_ = TunnelState(side_, state_.max_channels());
  told_at_cap_ = false;
  accepting_ = true;
  accept_again_at_.reset();
}

void StoreTunnel::add_poll_fds(const NodeLink& link, std::vector<pollfd>& fds) const {
  if (listener_.get() >= 0 && accepting_ && !accept_again_at_) fds.push_back({listener_.get(), POLLIN, 0});
  if (timer_.get() >= 0) fds.push_back({timer_.get(), POLLIN, 0});
  const bool room = link.has_room_for_bulk();
  for (const auto& [channel, s] : sockets_) {
    if (s.fd.get() < 0) continue;  // host: waiting to connect again
    const short events = static_cast<short>((s.reading && room ? POLLIN : 0) |
                                            (s.connecting || !s.out.empty() ? POLLOUT : 0));
    if (events != 0) fds.push_back({s.fd.get(), events, 0});
  }
}

bool StoreTunnel::owns(int fd) const {
  if (fd < 0) return false;
  if (fd == listener_.get() || fd == timer_.get()) return true;
  return std::any_of(sockets_.begin(), sockets_.end(), [fd](const auto& s) { return s.second.fd.get() == fd; });
}

std::string StoreTunnel::on_ready(int fd, short revents, NodeLink& link) {
  if (revents == 0) return "";
  std::string violation;
  if (fd == listener_.get()) {
    accept_workers(link, violation);
    return violation;
  }
  std::vector<TunnelAction> next;
  if (fd == timer_.get()) {
    std::uint64_t expirations = 0;
    [[maybe_unused]] const ssize_t n = read(timer_.get(), &expirations, sizeof(expirations));
    if (accept_again_at_ && *accept_again_at_ <= Clock::now()) accept_again_at_.reset();
    retry_due(next);
    return carry_out(std::move(next), link);
  }
  const auto it =
      std::find_if(sockets_.begin(), sockets_.end(), [fd](const auto& s) { return s.second.fd.get() == fd; });
  if (it == sockets_.end()) return "";
  const int channel = it->first;
  Socket& s = it->second;
  if (s.connecting) {
    int error = 0;
    socklen_t size = sizeof(error);
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &size) != 0) error = errno;
    if (error == 0 && (revents & POLLOUT) == 0 && (revents & (POLLERR | POLLHUP)) != 0) error = ECONNREFUSED;
    connect_finished(channel, error, next);
    return carry_out(std::move(next), link);
  }
  if ((revents & POLLOUT) != 0 && !s.out.empty()) write_socket(channel, next);
  const auto again = sockets_.find(channel);
  if (again != sockets_.end() && again->second.fd.get() == fd && again->second.reading &&
      (revents & (POLLIN | POLLHUP | POLLERR)) != 0) {
    read_socket(channel, next);
  }
  return carry_out(std::move(next), link);
}

void StoreTunnel::accept_workers(NodeLink& link, std::string& violation) {
  // A bounded number per call, so that the link and the channels are served between.
  for (int i = 0; i < 16 && listener_.get() >= 0 && accepting_; ++i) {
    const int fd = accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0 && out_of_descriptors(errno) && timer_.get() >= 0) {  // Note [Store tunnel out of descriptors]
      tell_out_of_descriptors("accepting a worker's connection to the store", errno);
      accept_again_at_ = Clock::now() + kAcceptPause;
      arm_timer();
      return;
    }
    if (fd < 0) return;  // EAGAIN: none waits; anything else: the worker sees its connect fail
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    accepted_ = OwnedFd(fd);
    const std::string why = carry_out(state_.on_accepted(), link);
    accepted_.reset();  // refused, if not adopted
    if (!why.empty() && violation.empty()) violation = why;
  }
}

std::string StoreTunnel::carry_out(std::vector<TunnelAction> actions, NodeLink& link) {
  std::string violation;
  std::deque<TunnelAction> todo(std::make_move_iterator(actions.begin()), std::make_move_iterator(actions.end()));
  while (!todo.empty()) {
    TunnelAction a = std::move(todo.front());
    todo.pop_front();
    std::vector<TunnelAction> next;
    switch (a.kind) {
      case Kind::kSendPeer:
        link.send(a.message);  // a link that is gone says so at its next receive()
        break;
      case Kind::kAdoptLocal: {
        Socket& s = sockets_[a.channel];
        s.fd = std::move(accepted_);
        s.reading = true;
        break;
      }
      case Kind::kRefuseLocal:
        accepted_.reset();
        break;
      case Kind::kConnectStore:
        sockets_.erase(a.channel);
        sockets_.try_emplace(a.channel);
        connect_store(a.channel, next);
        break;
      case Kind::kWriteLocal: {
        const auto it = sockets_.find(a.channel);
        if (it == sockets_.end()) break;
        it->second.out += a.bytes;
        write_socket(a.channel, next);
        break;
      }
      case Kind::kCloseLocal:
        sockets_.erase(a.channel);
        break;
      case Kind::kPauseReading:
      case Kind::kResumeReading:
        if (const auto it = sockets_.find(a.channel); it != sockets_.end()) {
          it->second.reading = a.kind == Kind::kResumeReading;
        }
        break;
      case Kind::kStopAccepting:
        accepting_ = false;
        if (!told_at_cap_) {  // Note [Channels a node may hold]: a wait the workers would not explain
          told_at_cap_ = true;
          // Any local process may connect to MASTER_PORT, not only the workers: the message says so.
          std::cerr << "cpprun: warning: " << state_.max_channels()
                    << " connections to the job's store through the agents' link are open on this node, the most "
                       "one node may hold (3 per worker and 64 more, at least "
                    << kMinChannelCap << ", at most " << kMaxChannelCap
                    << "); a new one waits until one of them closes. If this node's workers do not hold that many, "
                       "another process on this host does (anything local may connect to MASTER_PORT)\n";
        }
        break;
      case Kind::kResumeAccepting:
        accepting_ = true;
        break;
      case Kind::kViolation:
        if (violation.empty()) violation = a.why;
        break;
    }
    for (TunnelAction& n : next) todo.push_back(std::move(n));
  }
  arm_timer();
  return violation;
}

void StoreTunnel::connect_store(int channel, std::vector<TunnelAction>& next) {
  Socket& s = sockets_[channel];
  s.retry_at.reset();
  const SocketAddress a = loopback_address(store_.address, store_.port);
  s.fd = OwnedFd(socket(a.storage.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (s.fd.get() < 0) {
    const int error = errno;
    if (out_of_descriptors(error)) {  // Note [Store tunnel out of descriptors]
      tell_out_of_descriptors("connecting a channel to the workers' store at " + store_.address + ":" +
                                  std::to_string(store_.port),
                              error);
    }
    return connect_finished(channel, error, next);
  }
  const int one = 1;
  setsockopt(s.fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (connect(s.fd.get(), reinterpret_cast<const sockaddr*>(&a.storage), a.size) == 0) {
    return connect_finished(channel, 0, next);
  }
  if (errno == EINPROGRESS) {
    s.connecting = true;
    return;
  }
  connect_finished(channel, errno, next);
}

void StoreTunnel::connect_finished(int channel, int error, std::vector<TunnelAction>& next) {
  Socket& s = sockets_[channel];
  s.connecting = false;
  // Met itself at the store's free port: closed, and tried again, so that it never holds the port.
  if (error == 0 && connected_to_itself(s.fd.get())) error = ECONNREFUSED;
  if (error == 0) {
    s.reading = true;
    for (TunnelAction& a : state_.on_store_connected(channel)) next.push_back(std::move(a));
    return;
  }
  // A refused connect (the keeper gone, descriptors short) never resets the worker's connection: try
  // again (Note [Store tunnel wired]).
  s.fd.reset();
  const auto pause = std::min<std::chrono::milliseconds>(kLastRetry, kFirstRetry * (1 << std::min(s.refusals, 5)));
  ++s.refusals;
  s.retry_at = Clock::now() + pause;
}

void StoreTunnel::retry_due(std::vector<TunnelAction>& next) {
  const auto now = Clock::now();
  std::vector<int> due;
  for (const auto& [channel, s] : sockets_) {
    if (s.retry_at && *s.retry_at <= now) due.push_back(channel);
  }
  for (int channel : due) connect_store(channel, next);
}

void StoreTunnel::ensure_timer() {
  if (timer_.get() < 0) timer_ = OwnedFd(timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC));
}

void StoreTunnel::arm_timer() {
  std::optional<Clock::time_point> first = accept_again_at_;
  for (const auto& [channel, s] : sockets_) {
    if (s.retry_at && (!first || *s.retry_at < *first)) first = s.retry_at;
  }
  if (!first && timer_.get() < 0) return;
  ensure_timer();
  if (timer_.get() < 0) return;  // out of descriptors since before the round: nothing wakes the retries
  itimerspec when{};             // all zero: disarmed
  if (first) {
    const auto left = std::max<Clock::duration>(*first - Clock::now(), std::chrono::milliseconds(1));
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
    when.it_value.tv_sec = static_cast<time_t>(ns / 1000000000);
    when.it_value.tv_nsec = static_cast<long>(ns % 1000000000);
  }
  timerfd_settime(timer_.get(), 0, &when, nullptr);
}

void StoreTunnel::tell_out_of_descriptors(const std::string& what, int error) {
  if (std::exchange(told_out_of_descriptors_, true)) return;
  rlimit limit{};
  getrlimit(RLIMIT_NOFILE, &limit);
  std::cerr << "cpprun: " << what << " failed: " << std::strerror(error) << " (this agent may have "
            << limit.rlim_cur << " files open: ulimit -n); trying again as descriptors free up. Raise the "
            << "limit on this node (ulimit -n, or LimitNOFILE= for a service) for a job this large.\n";
}

void StoreTunnel::read_socket(int channel, std::vector<TunnelAction>& next) {
  Socket& s = sockets_[channel];
  static thread_local char buffer[kMaxTunnelChunkBytes];
  const ssize_t n = recv(s.fd.get(), buffer, sizeof(buffer), 0);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
  std::vector<TunnelAction> got;
  if (n <= 0) {
    s.reading = false;
    got = state_.on_local_eof(channel);
  } else {
    got = state_.on_local_bytes(channel, std::string(buffer, static_cast<std::size_t>(n)));
  }
  for (TunnelAction& a : got) next.push_back(std::move(a));
}

void StoreTunnel::write_socket(int channel, std::vector<TunnelAction>& next) {
  Socket& s = sockets_[channel];
  if (s.fd.get() < 0 || s.connecting) return;
  std::size_t written = 0;
  while (written < s.out.size()) {
    const ssize_t n = send(s.fd.get(), s.out.data() + written, s.out.size() - written, MSG_NOSIGNAL);
    if (n > 0) {
      written += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    // The other end is gone: what it was sent goes nowhere.
    s.out.clear();
    s.reading = false;
    for (TunnelAction& a : state_.on_local_eof(channel)) next.push_back(std::move(a));
    return;
  }
  if (written == 0) return;
  s.out.erase(0, written);
  for (TunnelAction& a : state_.on_local_written(channel, written)) next.push_back(std::move(a));
}

}  // namespace cpprun::launcher
