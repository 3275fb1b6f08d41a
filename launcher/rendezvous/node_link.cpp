// Non-blocking sockets for the agents' links, read from the agent's poll() loop; each proves the
// job secret before it carries a message (Note [Agent authentication]).
#include "rendezvous/node_link.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iostream>
#include <memory>
#include <system_error>

#include "command_line/rendezvous_settings.h"
#include "common/formatting.h"
#include "common/job_secret.h"
#include "common/socket_address.h"

namespace cpprun::launcher {
namespace {

// A line longer than this is not one of our messages: before the secret is proven (a stranger's flood),
// and after it, where an evidence message is the longest (Note [Bounding a peer's evidence]) and the
// line adds its sequence number and tag.
constexpr std::size_t kMaxLine = 64 * 1024;
constexpr std::size_t kMaxSessionLine = kMaxEvidenceBytes + 256;

// The handshake's words (Note [Agent authentication]).
constexpr const char* kChallengeWord = "cpprun-auth";
constexpr const char* kProofWord = "cpprun-proof";
constexpr const char* kAcceptedWord = "cpprun-auth-ok";
constexpr const char* kRefusedWord = "cpprun-auth-refused";
constexpr const char* kBusyWord = "cpprun-auth-busy";  // Note [Pending links under a flood]

bool is_nonce(const std::string& word) {
  return word.size() == 32 && word.find_first_not_of("0123456789abcdef") == std::string::npos;
}

// Notices a peer host that vanished without closing the connection (power loss, cable): probes
// after 10 s of silence, every 5 s, 4 times. Unacknowledged data gives up after 30 s.
void enable_keepalive(int fd) {
  static const int kOptions[][3] = {{SOL_SOCKET, SO_KEEPALIVE, 1},         {IPPROTO_TCP, TCP_KEEPIDLE, 10},
                                    {IPPROTO_TCP, TCP_KEEPINTVL, 5},        {IPPROTO_TCP, TCP_KEEPCNT, 4},
                                    {IPPROTO_TCP, TCP_USER_TIMEOUT, 30000}, {IPPROTO_TCP, TCP_NODELAY, 1}};
  for (const auto& [level, name, value] : kOptions) setsockopt(fd, level, name, &value, sizeof(value));
}

// The IPv4 address in `address`, also as a dual-stack socket's IPv4 peer (::ffff:a.b.c.d); else nullptr.
const unsigned char* ipv4_bytes(const sockaddr* address) {
  if (address->sa_family == AF_INET) {
    return reinterpret_cast<const unsigned char*>(&reinterpret_cast<const sockaddr_in*>(address)->sin_addr);
  }
  const in6_addr& in6 = reinterpret_cast<const sockaddr_in6*>(address)->sin6_addr;
  return address->sa_family == AF_INET6 && IN6_IS_ADDR_V4MAPPED(&in6) ? &in6.s6_addr[12] : nullptr;
}

int port_of(const sockaddr* address) {
  return ntohs(address->sa_family == AF_INET6 ? reinterpret_cast<const sockaddr_in6*>(address)->sin6_port
                                              : reinterpret_cast<const sockaddr_in*>(address)->sin_port);
}

// Numeric, without the port: "10.0.0.2", "fd00::2"; a dual-stack socket's IPv4 one as IPv4. "" if neither.
std::string host_text(const sockaddr* address) {
  char host[INET6_ADDRSTRLEN] = "";
  if (const unsigned char* v4 = ipv4_bytes(address)) {
    inet_ntop(AF_INET, v4, host, sizeof(host));
  } else if (address->sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(address)->sin6_addr, host, sizeof(host));
  }
  return host;
}

std::string address_text(const sockaddr* address) {
  const std::string host = host_text(address);
  return host.empty() ? "?" : endpoint_text(host, port_of(address));
}

bool is_loopback_address(const sockaddr* address) {
  if (const unsigned char* v4 = ipv4_bytes(address)) return v4[0] == 127;
  return address->sa_family == AF_INET6 &&
         IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(address)->sin6_addr);
}

using AddressList = std::unique_ptr<addrinfo, decltype(&freeaddrinfo)>;

// getaddrinfo() for a TCP connection; empty, with `error` set, when it fails.
AddressList resolve(const std::string& host, int port, std::string& error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* head = nullptr;
  const int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &head);
  if (rc != 0) error = "cannot resolve " + host + ": " + gai_strerror(rc);
  return AddressList(rc == 0 ? head : nullptr, &freeaddrinfo);
}

// A non-blocking socket listening at `address`, or -1 with errno set. `exclusive` (a c10d endpoint):
// IPv6 only on an IPv6 address, and SO_REUSEADDR so that a previous job's connections in TIME_WAIT do
// not block the endpoint; a second listener is still refused, which decides the host.
// `v6only`: an IPv6 socket takes no IPv4 (a dual-stack one does). `reuse_address`: a fixed port can be
// listened on again while an earlier job's connections there are in TIME_WAIT, as c10d's store allows.
int listen_socket(const sockaddr* address, socklen_t size, bool v6only, bool reuse_address) {
  const int fd = socket(address->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  const int on = 1;
  const int v6only_flag = v6only ? 1 : 0;
  if (reuse_address) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
  if (address->sa_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6only_flag, sizeof(v6only_flag));
  if (bind(fd, address, size) == 0 && listen(fd, 128) == 0) return fd;
  const int error = errno;
  close(fd);
  errno = error;
  return -1;
}

// Names only the address, and only the first few, so that a stranger cannot flood the console.
void warn_refused_link(const std::string& peer, const std::string& why) {
  static int refused = 0;
  constexpr int kShown = 5;
  ++refused;
  if (refused <= kShown) std::cerr << "cpprun: warning: refused a connection from " << peer << ": " << why << "\n";
  if (refused == kShown) std::cerr << "cpprun: warning: further refused connections are not shown\n";
}

}  // namespace

void OwnedFd::reset() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

NodeLink::NodeLink(int fd, std::string peer, LinkSide side, std::string secret)
    : fd_(fd), peer_(std::move(peer)), side_(side), secret_(std::move(secret)),
      state_(side == LinkSide::kHost ? State::kAwaitProof : State::kAwaitChallenge), opened_(Clock::now()) {
  if (side_ == LinkSide::kHost) {
    host_nonce_ = random_nonce();
    queue_line(std::string(kChallengeWord) + " 1 " + host_nonce_);
  }
}

std::string NodeLink::local_address() const {
  sockaddr_storage local{};
  socklen_t size = sizeof(local);
  if (fd_.get() < 0 || getsockname(fd_.get(), reinterpret_cast<sockaddr*>(&local), &size) != 0) return "";
  return host_text(reinterpret_cast<const sockaddr*>(&local));
}

std::optional<Clock::time_point> NodeLink::handshake_due() const {
  if (state_ == State::kOpen) return std::nullopt;
  return opened_ + kHandshakeTimeout;
}

bool NodeLink::handshake_overdue(Clock::time_point now) const {
  const std::optional<Clock::time_point> due = handshake_due();
  return due && now >= *due;
}

// Note [The link's outbound queue]
bool NodeLink::queue_line(const std::string& text) {
  if (fd_.get() < 0 || !stalled_.empty()) return false;
  if (head_ == queue_.size()) progressed_ = Clock::now();  // the drain timeout counts from the first byte waiting
  queue_ += text;
  queue_ += '\n';
  if (queued_bytes() > bounds_.hard_bytes) {
    stall("stopped reading its link: more than " + std::to_string(bounds_.hard_bytes >> 20) +
          " MiB of messages waited for it (the link's bound)");
    return false;
  }
  return flush();
}

bool NodeLink::flush() {
  if (fd_.get() < 0 || !stalled_.empty()) return false;
  while (head_ < queue_.size()) {
    const ssize_t n = ::send(fd_.get(), queue_.data() + head_, queue_.size() - head_, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      head_ += static_cast<std::size_t>(n);
      progressed_ = Clock::now();
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      break;
    } else {
      // EPIPE, ECONNRESET...: nothing more can go out; poll() reports the end, and receive() reads it.
      queue_.clear();
      head_ = 0;
      return false;
    }
  }
  if (head_ == queue_.size()) {
    queue_.clear();
    head_ = 0;
  } else if (head_ >= queue_.size() / 2) {
    queue_.erase(0, head_);  // the written half goes; what is left moves at most once per its size written
    head_ = 0;
  }
  if (wants_write() && Clock::now() - progressed_ >= bounds_.drain_timeout) {
    stall("stopped reading its link: nothing sent to it could be written for " +
          decimal_seconds(bounds_.drain_timeout) + " s (the link's bound)");
    return false;
  }
  return true;
}

void NodeLink::stall(std::string why) {
  stalled_ = std::move(why);
  queue_.clear();
  head_ = 0;
  // The descriptor stays open until receive(): poll() now reports it readable, so the loop reads the end.
  ::shutdown(fd_.get(), SHUT_RDWR);
}

bool NodeLink::send(const NodeMessage& message) {
  if (fd_.get() < 0 || !stalled_.empty()) return false;
  if (state_ != State::kOpen) {
    outbox_.push_back(message);  // the member's hello, written once the host is proven
    return true;
  }
  return send_line(encode_message(message));
}

bool NodeLink::send_line(const std::string& line) {
  if (fd_.get() < 0 || !stalled_.empty() || state_ != State::kOpen) return false;
  const auto direction = side_ == LinkSide::kHost ? LinkDirection::kHostToMember : LinkDirection::kMemberToHost;
  const std::uint64_t sequence = sent_++;
  return queue_line(std::to_string(sequence) + " " + message_tag(session_key_, direction, sequence, line) + " " + line);
}

void flush_links(const std::vector<NodeLink*>& links, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    std::vector<pollfd> waiting;
    for (NodeLink* link : links) {
      if (link->wants_write() && link->flush() && link->wants_write()) waiting.push_back({link->fd(), POLLOUT, 0});
    }
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (waiting.empty() || left <= 0) return;
    if (poll(waiting.data(), waiting.size(), static_cast<int>(left)) < 0 && errno != EINTR) return;
  }
}

void NodeLink::open_session() {
  session_key_ = session_key(secret_, host_nonce_, member_nonce_);
  state_ = State::kOpen;
  for (const NodeMessage& message : std::exchange(outbox_, {})) send(message);
}

// The member reads the host's challenge and answers it with its proof.
bool NodeLink::answer_challenge(const std::string& line, Received& got) {
  const std::vector<std::string> words = split_words(line);
  if (words.size() != 3 || words[0] != kChallengeWord || words[1] != "1" || !is_nonce(words[2])) {
    got.violation = "sent a line that is not a cpprun agent message: '" + printable(line.substr(0, 200)) + "'";
    return false;
  }
  heard_host_ = true;
  host_nonce_ = words[2];
  member_nonce_ = random_nonce();
  state_ = State::kAwaitVerdict;
  return queue_line(std::string(kProofWord) + " " + member_nonce_ + " " +
                    member_proof(secret_, host_nonce_, member_nonce_));
}

// The host checks the member's proof: the link opens, or is refused without a word about the job.
bool NodeLink::check_proof(const std::string& line, Received& got) {
  const std::vector<std::string> words = split_words(line);
  const bool proven = words.size() == 3 && words[0] == kProofWord && is_nonce(words[1]) &&
                      same_proof(words[2], member_proof(secret_, host_nonce_, words[1]));
  if (!proven) {
    queue_line(kRefusedWord);  // written at once, or not at all: receive() closes the link next
    got.refused = words.size() == 3 && words[0] == kProofWord
                      ? "it did not prove that it holds this job's secret: it was given another one"
                      : "it did not prove that it holds this job's secret: an older cpprun, or not a cpprun agent";
    return false;
  }
  member_nonce_ = words[1];
  if (!queue_line(std::string(kAcceptedWord) + " " + host_proof(secret_, host_nonce_, member_nonce_))) return false;
  open_session();
  return true;
}

// The member checks the host's answer: the host must prove the secret too.
bool NodeLink::check_verdict(const std::string& line, Received& got) {
  const std::vector<std::string> words = split_words(line);
  if (words.size() == 1 && words[0] == kRefusedWord) {
    // Given no secret, agents on one host share the one kept for their port and --rdzv_id
    // (host_secret.h): another --rdzv_id holds another secret, and is refused here, before `hello`
    // could name the id.
    got.refused = "refused this agent's proof of the job secret: the nodes were given different secrets "
                  "(CPPRUN_JOB_SECRET or --job_secret_file; given neither, agents on one host share one only "
                  "when started by the same user with the same XDG_RUNTIME_DIR, --rdzv_id and endpoint port, "
                  "and a --nnodes=1 job's is its agent's own); give every node the same secret, and the same "
                  "--rdzv_id";
    return false;
  }
  if (words.size() != 2 || words[0] != kAcceptedWord ||
      !same_proof(words[1], host_proof(secret_, host_nonce_, member_nonce_))) {
    got.refused = "could not prove that it holds this job's secret: another job's agent, or not a cpprun agent, "
                  "listens there";
    return false;
  }
  open_session();
  return true;
}

// "SEQUENCE TAG MESSAGE": the next number in order, and the tag of the session's key over it.
bool NodeLink::read_message(const std::string& line, Received& got) {
  const auto first = line.find(' ');
  const auto second = first == std::string::npos ? std::string::npos : line.find(' ', first + 1);
  const auto direction = side_ == LinkSide::kHost ? LinkDirection::kMemberToHost : LinkDirection::kHostToMember;
  if (second == std::string::npos || line.compare(0, first, std::to_string(received_)) != 0) {
    got.violation = "sent a message out of sequence or without its tag (replayed, or not from this job's agent)";
    return false;
  }
  const std::string tag = line.substr(first + 1, second - first - 1);
  const std::string body = line.substr(second + 1);
  if (!same_proof(tag, message_tag(session_key_, direction, received_, body))) {
    got.violation = "sent a message whose tag does not match (forged, or altered on the way)";
    return false;
  }
  ++received_;
  std::string why;
  std::optional<NodeMessage> message = decode_message(body, &why);
  if (!message) {
    got.violation = why + ": '" + printable(body.substr(0, 200)) + "'";
    return false;
  }
  got.messages.push_back(std::move(*message));
  return true;
}

bool NodeLink::process_line(const std::string& line, Received& got) {
  if (side_ == LinkSide::kMember && state_ != State::kOpen && line == kBusyWord) {
    got.busy = true;  // Note [Pending links under a flood]
    heard_host_ = true;
    return false;
  }
  switch (state_) {
    case State::kAwaitChallenge: return answer_challenge(line, got);
    case State::kAwaitProof: return check_proof(line, got);
    case State::kAwaitVerdict: return check_verdict(line, got);
    case State::kOpen: return read_message(line, got);
    case State::kClosed: return false;
  }
  return false;
}

NodeLink::Received NodeLink::receive() {
  Received got;
  got.closed = fd_.get() < 0 || !stalled_.empty();
  got.stalled = stalled_;
  if (got.closed) {
    state_ = State::kClosed;
    fd_.reset();
    return got;
  }
  char chunk[4096];
  ssize_t n = 1;
  const std::size_t max_line = state_ == State::kOpen ? kMaxSessionLine : kMaxLine;
  while (buffer_.size() <= max_line) {  // no more than one line's worth from a flood
    n = recv(fd_.get(), chunk, sizeof(chunk), 0);
    if (n > 0) buffer_.append(chunk, static_cast<std::size_t>(n));
    if (n == 0 || (n < 0 && errno != EINTR)) break;
  }
  // 0: an orderly close; else ECONNRESET, ETIMEDOUT (keep-alive), ...
  if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) got.closed = true;
  std::size_t start = 0;
  bool ok = true;
  for (std::size_t end; ok && (end = buffer_.find('\n', start)) != std::string::npos; start = end + 1) {
    ok = process_line(buffer_.substr(start, end - start), got);
  }
  buffer_.erase(0, ok ? start : buffer_.size());
  const std::size_t limit = state_ == State::kOpen ? kMaxSessionLine : kMaxLine;  // the handshake may have ended
  if (ok && buffer_.size() > limit) {
    got.violation = "sent a line longer than " + std::to_string(limit) + " bytes";
    ok = false;
  }
  if (!ok) got.closed = true;
  if (got.closed) {
    state_ = State::kClosed;
    fd_.reset();
  }
  return got;
}

LinkListener::LinkListener(const std::optional<std::string>& loopback_address, int port, std::string secret)
    : secret_(std::move(secret)), loopback_address_(loopback_address) {
  // Dual-stack IPv6 takes IPv4 too; a host without IPv6 gets an IPv4 socket. On the loopback: exactly
  // the address node 0 is known by (::1 over IPv6 only; 127.0.0.1 as IPv4, or IPv4-mapped).
  sockaddr_in6 v6{};
  v6.sin6_family = AF_INET6;
  v6.sin6_addr = in6addr_any;
  v6.sin6_port = htons(static_cast<uint16_t>(port));
  sockaddr_in v4{};
  v4.sin_family = AF_INET;
  v4.sin_addr.s_addr = htonl(INADDR_ANY);
  v4.sin_port = htons(static_cast<uint16_t>(port));
  const bool fixed_port = port != 0;
  int fd = -1;
  if (loopback_address && inet_pton(AF_INET6, loopback_address->c_str(), &v6.sin6_addr) == 1) {
    fd = listen_socket(reinterpret_cast<sockaddr*>(&v6), sizeof(v6), true, true);
  } else {
    if (loopback_address) {
      if (inet_pton(AF_INET, loopback_address->c_str(), &v4.sin_addr) != 1) {
        throw std::system_error(EINVAL, std::generic_category(), "cpprun: listening at " + *loopback_address);
      }
      inet_pton(AF_INET6, ("::ffff:" + *loopback_address).c_str(), &v6.sin6_addr);
    }
    fd = listen_socket(reinterpret_cast<sockaddr*>(&v6), sizeof(v6), false, fixed_port);
    // A host without IPv6 (EAFNOSUPPORT), not a taken port, falls back to IPv4.
    if (fd < 0 && errno != EADDRINUSE) {
      fd = listen_socket(reinterpret_cast<sockaddr*>(&v4), sizeof(v4), false, fixed_port);
    }
  }
  if (fd < 0) throw std::system_error(errno, std::generic_category(), "cpprun: listening for the other nodes' agents");
  fd_ = OwnedFd(fd);
  port_ = bound_port(fd);
}

EndpointListener LinkListener::at_endpoint(const std::string& host, int port, const std::string& secret) {
  EndpointListener result;
  const AddressList addresses = resolve(host, port, result.error);
  if (!addresses) return result;
  result.status = ListenStatus::kNotHere;
  for (const addrinfo* a = addresses.get(); a != nullptr; a = a->ai_next) {
    const int fd = listen_socket(a->ai_addr, a->ai_addrlen, true, true);
    if (fd >= 0) return {ListenStatus::kListening, LinkListener(fd, port, secret), ""};
    if (errno == EADDRINUSE) return {ListenStatus::kTaken, std::nullopt, ""};
    if (errno != EADDRNOTAVAIL && errno != EAFNOSUPPORT) {
      const std::string why = std::strerror(errno);
      return {ListenStatus::kFailed, std::nullopt, "cannot listen at " + address_text(a->ai_addr) + ": " + why};
    }
  }
  return result;
}

std::optional<NodeLink> LinkListener::accept() {
  sockaddr_storage peer{};
  socklen_t size = sizeof(peer);
  int fd = -1;
  do {
    fd = accept4(fd_.get(), reinterpret_cast<sockaddr*>(&peer), &size, SOCK_NONBLOCK | SOCK_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return std::nullopt;  // nothing waiting, or it went away already
  enable_keepalive(fd);
  return NodeLink(fd, address_text(reinterpret_cast<sockaddr*>(&peer)), LinkSide::kHost, secret_);
}

std::string peer_source(const std::string& peer) {
  const auto colon = peer.rfind(':');
  std::string host = colon == std::string::npos ? peer : peer.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return host;
}

void NodeLink::drop_busy() {
  if (fd_.get() < 0) return;
  // Best effort and never blocking: a stranger that does not read gets nothing more.
  queue_line(kBusyWord);
  state_ = State::kClosed;
  fd_.reset();
}

PendingLinks::PendingLinks() : timer_(timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC)) {}

void PendingLinks::accept_from(LinkListener& listener) {
  drop_overdue(Clock::now());  // room first
  // Bounded per call: see Note [Pending links under a flood].
  for (int accepted = 0; accepted < 256; ++accepted) {
    std::optional<NodeLink> link = listener.accept();
    if (!link) break;
    add(std::move(*link));
  }
  drop_overdue(Clock::now());  // drops none of those: arms the timer for them
}

HandshakeSweep handshake_sweep(const std::vector<std::optional<Clock::time_point>>& due, Clock::time_point now) {
  HandshakeSweep sweep;
  for (std::size_t i = 0; i < due.size(); ++i) {
    if (!due[i]) continue;
    if (*due[i] <= now) {
      sweep.overdue.push_back(i);
    } else if (!sweep.next_due || *due[i] < *sweep.next_due) {
      sweep.next_due = due[i];
    }
  }
  return sweep;
}

// Note [Pending links on the agent's clock]
void PendingLinks::drop_overdue(Clock::time_point now) {
  std::vector<std::optional<Clock::time_point>> due;
  for (const NodeLink& link : links_) due.push_back(link.handshake_due());
  const HandshakeSweep sweep = handshake_sweep(due, now);
  for (auto i = sweep.overdue.rbegin(); i != sweep.overdue.rend(); ++i) {
    links_.erase(links_.begin() + static_cast<std::ptrdiff_t>(*i));  // closed without a word, as a stranger's
  }
  if (timer_.get() < 0) return;
  itimerspec when{};  // all zero: disarmed
  if (sweep.next_due) {
    // From the clock read now, not `now`: a wake a little late, never early (read() sweeps at once again).
    const auto left = std::max<Clock::duration>(*sweep.next_due - Clock::now(), std::chrono::milliseconds(1));
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
    when.it_value.tv_sec = static_cast<time_t>(ns / 1000000000);
    when.it_value.tv_nsec = static_cast<long>(ns % 1000000000);
  }
  timerfd_settime(timer_.get(), 0, &when, nullptr);
}

void PendingLinks::add(NodeLink link) {
  const std::string source = peer_source(link.peer());
  const auto from = [&](const std::string& s) {
    return static_cast<std::size_t>(
        std::count_if(links_.begin(), links_.end(), [&](const NodeLink& l) { return peer_source(l.peer()) == s; }));
  };
  if (from(source) >= kMaxPendingPerSource && !evict_from(source)) {
    link.drop_busy();  // every link of that source has proven the secret: no stranger to evict
    return;
  }
  if (links_.size() >= kMaxPending) {
    // The source with the most pending links (the oldest link's, among equals) loses its oldest.
    std::string fullest;
    std::size_t most = 0;
    for (const NodeLink& l : links_) {
      const std::string s = peer_source(l.peer());
      if (const std::size_t n = from(s); n > most) {
        most = n;
        fullest = s;
      }
    }
    if (!evict_from(fullest)) {
      link.drop_busy();
      return;
    }
  }
  links_.push_back(std::move(link));
}

bool PendingLinks::verify(std::size_t i) {
  NodeLink::Received got = links_[i].receive();
  if (!got.messages.empty()) {
    introduced_.emplace_back(std::move(links_[i]), std::move(got.messages.front()));
    links_.erase(links_.begin() + static_cast<std::ptrdiff_t>(i));
    return false;
  }
  if (!got.refused.empty()) warn_refused_link(links_[i].peer(), got.refused);
  if (got.closed) {
    links_.erase(links_.begin() + static_cast<std::ptrdiff_t>(i));
    return false;
  }
  return true;
}

bool PendingLinks::evict_from(const std::string& source) {
  for (std::size_t i = 0; i < links_.size();) {
    if (peer_source(links_[i].peer()) != source) {
      ++i;
      continue;
    }
    if (!verify(i)) return true;  // it went by itself: room made
    if (links_[i].authenticated()) {
      ++i;  // proven: an agent of this job, about to say hello
      continue;
    }
    links_[i].drop_busy();
    links_.erase(links_.begin() + static_cast<std::ptrdiff_t>(i));
    return true;
  }
  return false;
}

std::optional<std::pair<NodeLink, NodeMessage>> PendingLinks::take_introduced() {
  if (introduced_.empty()) return std::nullopt;
  std::pair<NodeLink, NodeMessage> first = std::move(introduced_.front());
  introduced_.erase(introduced_.begin());
  return first;
}

std::vector<pollfd> PendingLinks::poll_fds() const {
  std::vector<pollfd> fds;
  for (const NodeLink& link : links_) fds.push_back(link.poll_entry());
  if (!links_.empty() && timer_.get() >= 0) fds.push_back({timer_.get(), POLLIN, 0});
  return fds;
}

std::optional<std::pair<NodeLink, NodeMessage>> PendingLinks::read(int fd) {
  if (fd >= 0 && fd == timer_.get()) {
    std::uint64_t expirations = 0;
    [[maybe_unused]] const ssize_t n = ::read(fd, &expirations, sizeof(expirations));
    drop_overdue(Clock::now());
    return std::nullopt;
  }
  const auto it = std::find_if(links_.begin(), links_.end(), [fd](const NodeLink& link) { return link.fd() == fd; });
  if (it == links_.end()) return std::nullopt;
  it->flush();  // the challenge, in the unlikely case that it did not fit at once
  NodeLink::Received got = it->receive();
  if (!got.messages.empty()) {
    std::pair<NodeLink, NodeMessage> introduced{std::move(*it), std::move(got.messages.front())};
    links_.erase(it);
    return introduced;
  }
  if (!got.refused.empty()) warn_refused_link(it->peer(), got.refused);
  if (got.closed) links_.erase(it);
  return std::nullopt;
}

ConnectResult connect_link(const std::string& host, int port, std::chrono::milliseconds timeout, int wake_fd,
                           const std::string& secret) {
  ConnectResult result;
  const AddressList addresses = resolve(host, port, result.error);
  if (!addresses) return result;
  const auto deadline = Clock::now() + timeout;
  for (const addrinfo* a = addresses.get(); a != nullptr; a = a->ai_next) {
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
      int ready = 0;
      do {
        const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
        ready = poll(fds, wake_fd >= 0 ? 2 : 1, static_cast<int>(std::max<long long>(left, 0)));
      } while (ready < 0 && errno == EINTR);
      if (ready > 0 && wake_fd >= 0 && (fds[1].revents & POLLIN) != 0) {
        close(fd);
        return {ConnectStatus::kInterrupted, std::nullopt, ""};
      }
      socklen_t size = sizeof(error);
      if (ready <= 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &size) != 0) error = ETIMEDOUT;
    }
    if (error == 0) {
      enable_keepalive(fd);
      return {ConnectStatus::kConnected, NodeLink(fd, where, LinkSide::kMember, secret), ""};
    }
    close(fd);
    result.error = where + ": " + std::strerror(error);
    if (Clock::now() >= deadline) break;
  }
  return result;
}

std::optional<std::string> loopback_listen_address(const std::string& host) {
  if (!is_loopback_host(host)) return std::nullopt;
  std::string error;
  const AddressList addresses = resolve(host, 0, error);
  if (!addresses) return std::nullopt;
  char text[INET6_ADDRSTRLEN] = {};
  const sockaddr* first = addresses->ai_addr;
  if (const unsigned char* v4 = ipv4_bytes(first)) {
    inet_ntop(AF_INET, v4, text, sizeof(text));
  } else {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(first)->sin6_addr, text, sizeof(text));
  }
  return std::string(text);
}

bool is_loopback_host(const std::string& host) {
  std::string error;
  const AddressList addresses = resolve(host, 0, error);
  for (const addrinfo* a = addresses.get(); a != nullptr; a = a->ai_next) {
    if (!is_loopback_address(a->ai_addr)) return false;
  }
  return addresses != nullptr;
}

}  // namespace cpprun::launcher
