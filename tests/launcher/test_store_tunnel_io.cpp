// Unit tests of the store tunnel's executor (rendezvous/store_tunnel_io.h) over real loopback sockets:
// a member and a host tunnel on the two ends of one authenticated link, a test "worker" connecting to
// the member's listener and a test "store" the host connects to. A worker's bytes reach the store and
// the answer comes back; a store that is not listening yet is retried, never resetting the worker;
// a new round, or the link's loss, closes the channels (on both ends).
#include "catch.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <functional>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "rendezvous/node_link.h"
#include "rendezvous/store_tunnel_io.h"

using namespace cpprun::launcher;

namespace {

const std::string kSecret = "a secret of this job, 32 chars!!";

int connect_to(const LoopbackEndpoint& at) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(at.port));
  inet_pton(AF_INET, at.address.c_str(), &addr.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

int listen_at(const LoopbackEndpoint& at) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(at.port));
  inet_pton(AF_INET, at.address.c_str(), &addr.sin_addr);
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  REQUIRE(listen(fd, 16) == 0);
  return fd;
}

// What `fd` has to read now: its bytes, "" if nothing yet, nullopt at its end (EOF or reset).
std::optional<std::string> read_now(int fd) {
  char chunk[4096];
  const ssize_t n = recv(fd, chunk, sizeof(chunk), MSG_DONTWAIT);
  if (n > 0) return std::string(chunk, static_cast<std::size_t>(n));
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return std::string();
  return std::nullopt;
}

// Whether nothing listens at `at` any more. Held bound (SO_REUSEADDR: Linux refuses it while a socket
// listens there) and not listening, the port refuses connections for sure, and no other test can take
// it in the meantime, as it could a port merely closed.
bool nothing_listens_at(const LoopbackEndpoint& at) {
  const int held = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1;
  setsockopt(held, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(at.port));
  inet_pton(AF_INET, at.address.c_str(), &addr.sin_addr);
  bool free = bind(held, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  if (free) {
    const int probe = connect_to(at);
    free = probe < 0;
    if (probe >= 0) close(probe);
  }
  close(held);
  return free;
}

// The two agents' ends of one link over the loopback, proven, each with its tunnel.
struct Agents {
  LinkListener listener{std::string("127.0.0.1"), 0, kSecret};
  std::optional<NodeLink> host;
  std::optional<NodeLink> member;
  StoreTunnel host_tunnel{LinkSide::kHost, kMinChannelCap};
  StoreTunnel member_tunnel{LinkSide::kMember, kMinChannelCap};
  std::vector<std::string> violations;
  int polls_ready = 0;  // pump_once()'s polls that found a descriptor ready

  Agents() {
    ConnectResult connected = connect_link("127.0.0.1", listener.port(), std::chrono::seconds(5), -1, kSecret);
    REQUIRE(connected.status == ConnectStatus::kConnected);
    member.emplace(std::move(*connected.link));
    for (int i = 0; i < 100 && !host; ++i) {
      host = listener.accept();
      pollfd fd{listener.fd(), POLLIN, 0};
      if (!host) poll(&fd, 1, 50);
    }
    REQUIRE(host);
    pump_until([&] { return host->authenticated() && member->authenticated(); });
    REQUIRE(host->authenticated());
  }

  // One poll over both links and both tunnels, as the agents' loops do (PeerEvents::poll_fds).
  void pump_once(int timeout_ms) {
    std::vector<pollfd> fds;
    if (host->fd() >= 0) fds.push_back(host->poll_entry());
    if (member->fd() >= 0) fds.push_back(member->poll_entry());
    host_tunnel.add_poll_fds(*host, fds);
    member_tunnel.add_poll_fds(*member, fds);
    if (poll(fds.data(), fds.size(), timeout_ms) <= 0) return;
    ++polls_ready;
    for (const pollfd& p : fds) {
      if (p.revents == 0) continue;
      for (auto [link, tunnel] : {std::pair{&*host, &host_tunnel}, std::pair{&*member, &member_tunnel}}) {
        if (tunnel->owns(p.fd)) {
          if (std::string why = tunnel->on_ready(p.fd, p.revents, *link); !why.empty()) violations.push_back(why);
        } else if (p.fd == link->fd()) {
          link->flush();
          NodeLink::Received got = link->receive();
          for (const NodeMessage& m : got.messages) {
            if (!is_tunnel_kind(m.kind)) continue;
            if (std::string why = tunnel->on_peer(m, *link); !why.empty()) violations.push_back(why);
          }
          if (got.closed) tunnel->on_link_lost();
        }
      }
    }
  }

  // Pumps until `done()`, for at most 5 s.
  void pump_until(const std::function<bool()>& done) {
    const auto deadline = Clock::now() + std::chrono::seconds(5);
    while (!done() && Clock::now() < deadline) pump_once(20);
  }

  void pump_for(std::chrono::milliseconds how_long) {
    const auto until = Clock::now() + how_long;
    while (Clock::now() < until) pump_once(10);
  }
};

// While alive, this process can open no more descriptors (EMFILE), and what it prints on std::cerr
// is kept in `printed`.
struct OutOfDescriptors {
  rlimit saved{};
  std::vector<int> held;  // fill()'s
  std::ostringstream printed;
  std::streambuf* cerr_was = std::cerr.rdbuf(printed.rdbuf());

  OutOfDescriptors() {
    getrlimit(RLIMIT_NOFILE, &saved);
    const int lowest_free = open("/dev/null", O_RDONLY | O_CLOEXEC);
    REQUIRE(lowest_free >= 0);
    close(lowest_free);
    rlimit none = saved;
    none.rlim_cur = static_cast<rlim_t>(lowest_free);
    REQUIRE(setrlimit(RLIMIT_NOFILE, &none) == 0);
    REQUIRE(open("/dev/null", O_RDONLY | O_CLOEXEC) < 0);
  }
  // Takes the numbers below the limit that were closed since (else the code under test takes them).
  void fill() {
    for (int fd; (fd = open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0;) held.push_back(fd);
  }
  ~OutOfDescriptors() {
    for (int fd : held) close(fd);
    setrlimit(RLIMIT_NOFILE, &saved);
    std::cerr.rdbuf(cerr_was);
  }
};

}  // namespace

TEST_CASE("store_tunnel_io: a worker's bytes reach a store that comes up late, and the answer comes back",
          "[store_tunnel_io]") {
  CHECK(loopback_family_for("10.0.0.1") == LoopbackFamily::kIpv4);
  CHECK(loopback_family_for("node0.example") == LoopbackFamily::kIpv4);
  CHECK(loopback_family_for("::1") == LoopbackFamily::kIpv6);
  CHECK(loopback_family_for("fd00::2") == LoopbackFamily::kIpv6);

  Agents agents;
  const LoopbackEndpoint store = free_loopback_port(LoopbackFamily::kIpv4);
  CHECK(store.address == "127.0.0.1");
  agents.host_tunnel.serve_round(1, store, *agents.host);
  // The store's port is taken here (the host's machine): the member listens where the kernel picks.
  const int taken = listen_at(store);
  const LoopbackEndpoint at =
      agents.member_tunnel.listen_for_round(1, LoopbackFamily::kIpv4, store.port, *agents.member);
  close(taken);
  CHECK(at.address == "127.0.0.1");
  CHECK(at.port != store.port);

  const int worker = connect_to(at);
  REQUIRE(worker >= 0);
  REQUIRE(send(worker, "ping", 4, 0) == 4);
  // Nothing listens at the store's port yet (rank 0 has not bound it): the host retries, and the
  // worker's connection stays open, its bytes held.
  agents.pump_for(std::chrono::milliseconds(300));
  CHECK(read_now(worker) == std::string());
  CHECK(agents.host_tunnel.open_sockets() == 1);

  const int store_fd = listen_at(store);
  int served = -1;
  agents.pump_until([&] { return (served = accept4(store_fd, nullptr, nullptr, SOCK_CLOEXEC)) >= 0; });
  REQUIRE(served >= 0);
  std::string request;
  agents.pump_until([&] {
    if (auto got = read_now(served)) request += *got;
    return request.size() >= 4;
  });
  CHECK(request == "ping");

  // More than one window (128 KiB) of answer: credit flows back as the worker reads it.
  const std::string answer(300 * 1024, 'a');
  std::string reply;
  std::size_t sent = 0;
  agents.pump_until([&] {
    if (sent < answer.size()) {
      const ssize_t n = send(served, answer.data() + sent, answer.size() - sent, MSG_DONTWAIT);
      if (n > 0) sent += static_cast<std::size_t>(n);
    }
    if (auto got = read_now(worker)) reply += *got;
    return reply.size() >= answer.size();
  });
  CHECK(reply == answer);

  // The worker closes: the store's connection closes too.
  close(worker);
  std::optional<std::string> end = std::string();
  agents.pump_until([&] { return !(end = read_now(served)).has_value(); });
  CHECK_FALSE(end.has_value());
  CHECK(agents.host_tunnel.open_sockets() == 0);
  CHECK(agents.member_tunnel.open_sockets() == 0);
  CHECK(agents.violations.empty());
  close(served);
  close(store_fd);
}

TEST_CASE("store_tunnel_io: a new round closes the last one's channels and listener; so does the link's loss",
          "[store_tunnel_io]") {
  Agents agents;
  const LoopbackEndpoint store = free_loopback_port(LoopbackFamily::kIpv4);
  const int store_fd = listen_at(store);
  agents.host_tunnel.serve_round(1, store, *agents.host);
  const LoopbackEndpoint first = agents.member_tunnel.listen_for_round(1, LoopbackFamily::kIpv4, 0, *agents.member);
  const int worker = connect_to(first);
  REQUIRE(worker >= 0);
  int served = -1;
  agents.pump_until([&] { return (served = accept4(store_fd, nullptr, nullptr, SOCK_CLOEXEC)) >= 0; });
  REQUIRE(served >= 0);

  // Round 2 starts on both sides: round 1's worker and store connections end, its listener is gone.
  agents.host_tunnel.end_round(1, *agents.host);
  agents.host_tunnel.serve_round(2, store, *agents.host);
  const LoopbackEndpoint second = agents.member_tunnel.listen_for_round(2, LoopbackFamily::kIpv4, 0, *agents.member);
  std::optional<std::string> worker_end = std::string();
  std::optional<std::string> store_end = std::string();
  agents.pump_until([&] {
    if (worker_end) worker_end = read_now(worker);
    if (store_end) store_end = read_now(served);
    return !worker_end && !store_end;
  });
  CHECK_FALSE(worker_end.has_value());
  CHECK_FALSE(store_end.has_value());
  if (second.port != first.port) CHECK(nothing_listens_at(first));
  close(worker);
  close(served);

  // A round-2 worker, then the member closes the link (as it does on the host's violation): the
  // worker's connection is closed at once, and on the host, seeing the link end, the store's.
  const int late = connect_to(second);
  REQUIRE(late >= 0);
  int late_served = -1;
  agents.pump_until([&] { return (late_served = accept4(store_fd, nullptr, nullptr, SOCK_CLOEXEC)) >= 0; });
  REQUIRE(late_served >= 0);
  REQUIRE(agents.member_tunnel.open_sockets() == 1);
  REQUIRE(agents.host_tunnel.open_sockets() == 1);
  agents.member->close();
  agents.member_tunnel.on_link_lost();
  CHECK(agents.member_tunnel.open_sockets() == 0);
  std::optional<std::string> late_end = std::string();
  std::optional<std::string> late_store_end = std::string();
  agents.pump_until([&] {
    if (late_end) late_end = read_now(late);
    if (late_store_end) late_store_end = read_now(late_served);
    return !late_end && !late_store_end;
  });
  CHECK_FALSE(late_end.has_value());
  CHECK_FALSE(late_store_end.has_value());
  CHECK(agents.host_tunnel.open_sockets() == 0);
  CHECK(nothing_listens_at(second));
  CHECK(agents.violations.empty());
  close(late);
  close(late_served);
  close(store_fd);
}

// Review s13 item 1: a member whose first link the host dropped before the handshake (busy under a
// flood) tells its tunnel the link is lost, then join() reconnects. The tunnel must work on the new
// link: otherwise every worker connection of every round is closed at once and the job fails.
TEST_CASE("store_tunnel_io: a member's tunnel starts over on the link that replaced one lost before its handshake",
          "[store_tunnel_io]") {
  Agents agents;
  agents.member_tunnel.on_link_lost();  // the first link, closed unproven
  agents.member_tunnel.on_new_link();   // join() reconnected: agents.member stands for the new link
  const LoopbackEndpoint store = free_loopback_port(LoopbackFamily::kIpv4);
  const int store_fd = listen_at(store);
  agents.host_tunnel.serve_round(1, store, *agents.host);
  const LoopbackEndpoint at = agents.member_tunnel.listen_for_round(1, LoopbackFamily::kIpv4, 0, *agents.member);
  const int worker = connect_to(at);
  REQUIRE(worker >= 0);
  REQUIRE(send(worker, "ping", 4, 0) == 4);
  int served = -1;
  agents.pump_until([&] { return (served = accept4(store_fd, nullptr, nullptr, SOCK_CLOEXEC)) >= 0; });
  REQUIRE(served >= 0);
  std::string request;
  agents.pump_until([&] {
    if (auto got = read_now(served)) request += *got;
    return request.size() >= 4;
  });
  CHECK(request == "ping");
  CHECK(read_now(worker) == std::string());  // still open
  CHECK(agents.violations.empty());
  close(worker);
  close(served);
  close(store_fd);
}

// Review s13 item 3: an agent out of descriptors says so once and tries again later, and its poll
// does not spin on a listener that accept4 cannot take from.
TEST_CASE("store_tunnel_io: out of descriptors, the member rests its listener and the host retries, saying why once",
          "[store_tunnel_io]") {
  Agents agents;
  const LoopbackEndpoint store = free_loopback_port(LoopbackFamily::kIpv4);
  agents.host_tunnel.serve_round(1, store, *agents.host);
  const LoopbackEndpoint at = agents.member_tunnel.listen_for_round(1, LoopbackFamily::kIpv4, 0, *agents.member);
  const int worker = connect_to(at);  // in the listener's backlog until the member accepts it
  REQUIRE(worker >= 0);
  REQUIRE(send(worker, "ping", 4, 0) == 4);
  std::string member_said;
  {
    OutOfDescriptors spent;
    agents.pump_for(std::chrono::milliseconds(500));
    member_said = spent.printed.str();
    // A listener polled while accept4 fails makes every poll return at once: thousands in 0.5 s.
    CHECK(agents.polls_ready < 30);
  }
  CHECK(member_said.find("accepting a worker's connection to the store failed: Too many open files") !=
        std::string::npos);
  CHECK(member_said.find("cpprun:") == member_said.rfind("cpprun:"));  // once

  // Descriptors free again: the member accepts; the host's connects are refused (no store yet).
  agents.pump_until([&] { return agents.host_tunnel.open_sockets() == 1; });
  REQUIRE(agents.host_tunnel.open_sockets() == 1);
  std::string host_said;
  {
    OutOfDescriptors spent;  // the host's retries cannot make a socket
    const auto until = Clock::now() + std::chrono::milliseconds(600);
    while (Clock::now() < until) {
      agents.pump_once(10);
      spent.fill();  // a connect under way when the limit fell, refused since
    }
    host_said = spent.printed.str();
  }
  CHECK(host_said.find("connecting a channel to the workers' store at 127.0.0.1:" + std::to_string(store.port) +
                       " failed: Too many open files") != std::string::npos);
  CHECK(host_said.find("cpprun:") == host_said.rfind("cpprun:"));
  CHECK(read_now(worker) == std::string());  // never reset for that

  // The store comes up: the next retry reaches it, and the worker's bytes with it.
  const int store_fd = listen_at(store);
  int served = -1;
  agents.pump_until([&] { return (served = accept4(store_fd, nullptr, nullptr, SOCK_CLOEXEC)) >= 0; });
  REQUIRE(served >= 0);
  std::string request;
  agents.pump_until([&] {
    if (auto got = read_now(served)) request += *got;
    return request.size() >= 4;
  });
  CHECK(request == "ping");
  CHECK(agents.violations.empty());
  close(worker);
  close(served);
  close(store_fd);
}

// Review s13 item 6: the host's connect to the store's port while it is free can meet itself (the
// kernel picks that port as the source): such a connection is no store, and is closed and retried.
TEST_CASE("store_tunnel_io: a connection that met itself is told from one that reached a listener",
          "[store_tunnel_io]") {
  const LoopbackEndpoint free_port = free_loopback_port(LoopbackFamily::kIpv4);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(free_port.port));
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  const int itself = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(bind(itself, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  REQUIRE(connect(itself, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);  // simultaneous open
  CHECK(connected_to_itself(itself));
  close(itself);

  const LoopbackEndpoint store = free_loopback_port(LoopbackFamily::kIpv4);
  const int store_fd = listen_at(store);
  const int client = connect_to(store);
  REQUIRE(client >= 0);
  CHECK_FALSE(connected_to_itself(client));
  CHECK_FALSE(connected_to_itself(store_fd));  // not connected at all
  close(client);
  close(store_fd);
}
