// The TCP links between the agents of a multi-node job. Each member agent keeps one connection to
// the agent hosting the rendezvous for the whole job; the messages of node_messages.h travel on it,
// and its end tells one agent at once that another is gone: the kernel closes a killed process's
// sockets, and TCP keep-alive notices a host that went away (about 30 s).
#pragma once

#include <poll.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "rendezvous/node_messages.h"

namespace cpprun::launcher {

using Clock = std::chrono::steady_clock;

// Which end of a link this agent holds: the host accepted it and challenges, the member connected.
enum class LinkSide { kHost, kMember };

// Closes its descriptor when destroyed. A move-assignment swaps: the source closes the old one.
class OwnedFd {
 public:
  explicit OwnedFd(int fd = -1) : fd_(fd) {}
  ~OwnedFd() { reset(); }
  OwnedFd(OwnedFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  OwnedFd& operator=(OwnedFd&& other) noexcept {
    std::swap(fd_, other.fd_);
    return *this;
  }
  int get() const { return fd_; }
  void reset();

 private:
  int fd_ = -1;
};

// Note [The link's outbound queue]
// send() never blocks: it appends the framed line (its sequence number and tag fixed then, so lines
// go out in the order sent) to the link's queue and writes what the socket takes at once; the rest
// is written by flush() when poll() says the socket takes more (the agent's loops poll a link for
// writing while wants_write(): PeerEvents::poll_fds). Control messages always queue: they are few and
// small. Bulk data (a later byte stream over the link) is produced only while has_room_for_bulk().
// A peer that stops reading is bounded twice: a queue past kLinkQueueHardBytes, or one of which not a
// byte could be written for kLinkDrainTimeout, ends the link with a reason naming the bound (receive()
// reports it as `stalled`). TCP_USER_TIMEOUT ends a link whose peer is gone; this ends one whose peer
// is there but does not read.
// What must be out before a link is closed or the agent exits (`exit`, `stopped`, `failed`, a
// refusal) is waited for by flush_links(), for at most kFinalFlushTimeout: the rendezvous's two sides
// do so when they are destroyed, which is when the agent exits, and the host when it refuses an agent.
inline constexpr std::size_t kLinkQueueSoftBytes = std::size_t{1} << 20;   // has_room_for_bulk() below it
inline constexpr std::size_t kLinkQueueHardBytes = std::size_t{64} << 20;  // past it the link ends
inline constexpr std::chrono::seconds kLinkDrainTimeout{30};
inline constexpr std::chrono::seconds kFinalFlushTimeout{5};

// The bounds of Note [The link's outbound queue]; tests make them small.
struct LinkQueueBounds {
  std::size_t soft_bytes = kLinkQueueSoftBytes;
  std::size_t hard_bytes = kLinkQueueHardBytes;
  std::chrono::milliseconds drain_timeout = kLinkDrainTimeout;
};

// One agent-to-agent connection. It proves the job secret first (Note [Agent authentication] in
// job_secret.h) and only then hands out messages; send() before that is queued until it is proven.
class NodeLink {
 public:
  // Takes a connected socket; `peer` ("10.0.0.2:41234") names it in messages. The host's side
  // sends its challenge at once.
  NodeLink(int fd, std::string peer, LinkSide side, std::string secret);

  int fd() const { return fd_.get(); }
  const std::string& peer() const { return peer_; }
  // This machine's end of the link, numeric ("10.0.0.2"; a dual-stack socket's IPv4 one as IPv4),
  // or "" once closed: the address this node reaches the other from (socket_interface.h).
  std::string local_address() const;
  bool authenticated() const { return state_ == State::kOpen; }
  // A member's side: the host sent its challenge (or said it was busy), so what listens there speaks
  // cpprun's protocol, even if it closed the link before the handshake completed.
  bool heard_host() const { return heard_host_; }
  // When it must have proven the secret, kHandshakeTimeout after it was opened; nullopt once proven.
  std::optional<Clock::time_point> handshake_due() const;
  // Not proven within kHandshakeTimeout of being opened: a stranger, or a peer that stopped halfway.
  bool handshake_overdue(Clock::time_point now) const;

  // Queues the message and writes what the socket takes, never blocking (Note [The link's outbound
  // queue]). False when the connection is gone or this send passed a bound; the next receive() then
  // reports it.
  bool send(const NodeMessage& message);
  // send() after encode_message: frames one message's line (its sequence number and tag) and queues it.
  // Public for the test tool cpprun_link_probe, which sends lines no agent would (`data` not in base64).
  bool send_line(const std::string& body);
  // Writes more of the queue, without blocking: call when poll() says fd() is writable, and after a
  // poll() that timed out while wants_write(), so that a queue that stopped draining is noticed.
  // False when the link is gone or has just ended on a bound (receive() then says which).
  bool flush();
  bool wants_write() const { return fd_.get() >= 0 && head_ < queue_.size(); }
  std::size_t queued_bytes() const { return queue_.size() - head_; }
  // Below the soft bound: a producer of bulk data may send more.
  bool has_room_for_bulk() const { return queued_bytes() < bounds_.soft_bytes; }
  // What to poll() this link for: reading, and writing while wants_write().
  pollfd poll_entry() const {
    return {fd(), static_cast<short>(POLLIN | (wants_write() ? POLLOUT : 0)), 0};
  }
  void set_queue_bounds(const LinkQueueBounds& bounds) { bounds_ = bounds; }
  // Closes the link at once, dropping what its queue holds: the peer broke the protocol.
  void close() {
    fd_.reset();
    queue_.clear();
    head_ = 0;
  }
  // The host's side, not yet proven: tells the peer that the host is busy (cpprun-auth-busy), closes.
  void drop_busy();

  struct Received {
    std::vector<NodeMessage> messages;  // complete, authenticated messages, in order
    bool closed = false;                // the peer closed the link, it broke, or one of the three below
    std::string violation;              // what the peer sent that is not our protocol
    std::string refused;                // why the secret was not proven
    std::string stalled;                // the peer stopped reading: which bound of the queue ended the link
    bool busy = false;                  // member side: the host dropped this link unproven, too busy
  };
  Received receive();  // without blocking: call when poll() says fd() is readable

  static constexpr std::chrono::seconds kHandshakeTimeout{10};

 private:
  enum class State { kAwaitChallenge, kAwaitProof, kAwaitVerdict, kOpen, kClosed };
  // Queues `line` and its newline, then flush(): false as for send().
  bool queue_line(const std::string& line);
  // Ends the link because its peer stopped reading: receive() reports `why`.
  void stall(std::string why);
  bool process_line(const std::string& line, Received& got);  // false: the link is to be closed
  bool answer_challenge(const std::string& line, Received& got);
  bool check_proof(const std::string& line, Received& got);
  bool check_verdict(const std::string& line, Received& got);
  bool read_message(const std::string& line, Received& got);
  void open_session();

  OwnedFd fd_;
  std::string peer_;
  LinkSide side_;
  std::string secret_;
  State state_;
  Clock::time_point opened_;
  std::string host_nonce_;
  std::string member_nonce_;
  std::string session_key_;
  std::uint64_t sent_ = 0;           // lines sent since the session opened
  std::uint64_t received_ = 0;       // lines received since the session opened
  std::vector<NodeMessage> outbox_;  // sent before the session opened
  std::string buffer_;               // an incomplete line
  std::string queue_;                // lines to write; those before head_ are written
  std::size_t head_ = 0;
  Clock::time_point progressed_;     // when the queue last got bytes out, or got its first ones
  LinkQueueBounds bounds_;
  std::string stalled_;              // why stall() ended the link, for receive()
  bool heard_host_ = false;          // heard_host()
};

// Waits until every link's queue is written, or `timeout` passed (Note [The link's outbound queue]):
// before the links are closed, or the agent exits.
void flush_links(const std::vector<NodeLink*>& links, std::chrono::milliseconds timeout);

enum class ListenStatus {
  kListening,  // this process now listens there
  kTaken,      // another process listens there (on this machine)
  kNotHere,    // no address of the host is this machine's
  kFailed,     // cannot resolve, or another error (`error` says which)
};

struct EndpointListener;

// Accepts the member agents' links: at --master_port (static) or at the c10d endpoint.
class LinkListener {
 public:
  // On `port` (0: one the kernel picks), at `loopback_address` alone (numeric: "127.0.0.1", "::1")
  // when given (every node on this host), else on every interface, as c10d's store listens. Throws
  // std::system_error (EADDRINUSE: another process listens on the port).
  LinkListener(const std::optional<std::string>& loopback_address, int port, std::string secret);
  // Listens at host:port, on the first of the host's addresses that is this machine's. Only one
  // process can: the others learn that it is taken (kTaken) and that agent hosts the rendezvous.
  static EndpointListener at_endpoint(const std::string& host, int port, const std::string& secret);
  int fd() const { return fd_.get(); }
  int port() const { return port_; }
  const std::optional<std::string>& loopback_address() const { return loopback_address_; }
  std::optional<NodeLink> accept();  // a waiting connection, if any; never blocks

 private:
  LinkListener(int fd, int port, std::string secret) : fd_(fd), port_(port), secret_(std::move(secret)) {}
  OwnedFd fd_;
  int port_ = 0;
  std::string secret_;
  std::optional<std::string> loopback_address_;
};

struct EndpointListener {
  ListenStatus status = ListenStatus::kFailed;
  std::optional<LinkListener> listener;  // kListening
  std::string error;
};

// The accepted links whose agents have not introduced themselves yet. Anyone who reaches the port
// can open one, so they are bounded, each dropped if unproven after NodeLink::kHandshakeTimeout and
// read at most one line's worth at a time.
//
// Note [Pending links on the agent's clock]
// An unproven link is dropped once NodeLink::kHandshakeTimeout has passed, whether or not anyone else
// connects: a stranger that sends half a line and falls silent must not keep its place (and its
// descriptor) for as long as the job runs. So the set keeps a timerfd, armed for the earliest
// deadline and polled with the links (poll_fds()) while any wait: every loop that polls the agent's
// links (joining, deciding, the workers' event loop) wakes on it, and read() of it drops the overdue.
// Which links are overdue and when to wake next is handshake_sweep's decision, pure; accept_from()
// sweeps too. (No descriptor for the timer: the links are still dropped, but only when one connects.)
//
// Note [Pending links under a flood]
// A stranger opening thousands of connections a second must not crowd out a node that holds the
// secret. So the bound is per source address first (kMaxPendingPerSource: a new link from a full
// source evicts that source's oldest), then overall (kMaxPending: the fullest source loses its
// oldest). Before a link is evicted, what it sent is read and verified: one that has proven the
// secret stays (or, with its hello, is handed over). An evicted link is told "cpprun-auth-busy", and
// its agent, if it is one, tries again until its join timeout, retry_pause() apart so as not to add
// to the flood (rendezvous_member.cpp).
class PendingLinks {
 public:
  static constexpr std::size_t kMaxPending = 64;
  static constexpr std::size_t kMaxPendingPerSource = 8;

  PendingLinks();  // makes the timer of Note [Pending links on the agent's clock]

  // Accepts the connections waiting at `listener` (a bounded number per call, so that the links
  // already pending are read between), after dropping the overdue ones.
  void accept_from(LinkListener& listener);
  // Each link's NodeLink::poll_entry(), and while any waits, the timer's (Note [Pending links on the
  // agent's clock]).
  std::vector<pollfd> poll_fds() const;
  // Writes (flush()) and reads the link on `fd`, if one of these; once it has proven the secret and
  // sent its first message, hands both over. A link that closed or was refused (warned about, by
  // address only) is dropped. The timer's `fd`: drops the links overdue now.
  std::optional<std::pair<NodeLink, NodeMessage>> read(int fd);
  // Drops the links that were not proven by their handshake_due(), as of `now`, and arms the timer
  // for the next deadline.
  void drop_overdue(Clock::time_point now);
  int timer_fd() const { return timer_.get(); }  // -1: none could be made
  // A link found introduced while accept_from() verified it before an eviction; call after accept_from().
  std::optional<std::pair<NodeLink, NodeMessage>> take_introduced();
  std::size_t size() const { return links_.size(); }

 private:
  void add(NodeLink link);
  // Reads and verifies links_[i]; false if it is gone (closed, refused, or handed to introduced_).
  bool verify(std::size_t i);
  // Evicts the oldest unproven link of `source`; false if it has none.
  bool evict_from(const std::string& source);

  std::vector<NodeLink> links_;  // oldest first
  std::vector<std::pair<NodeLink, NodeMessage>> introduced_;
  OwnedFd timer_;  // a timerfd: Note [Pending links on the agent's clock]
};

// The decision of Note [Pending links on the agent's clock]: given when each pending link must be
// proven by (NodeLink::handshake_due(); nullopt for one proven already), which are overdue at `now`
// (due at or before it), and when the earliest of the others falls due.
struct HandshakeSweep {
  std::vector<std::size_t> overdue;           // indices into `due`, ascending
  std::optional<Clock::time_point> next_due;  // nullopt: nothing left to wake for
};
HandshakeSweep handshake_sweep(const std::vector<std::optional<Clock::time_point>>& due, Clock::time_point now);

// "10.0.0.2" of a peer "10.0.0.2:41234" or "[::1]:41234": whom the per-source bound counts.
std::string peer_source(const std::string& peer);

enum class ConnectStatus {
  kConnected,
  kFailed,       // refused, unreachable, timed out or unresolvable: `error` says which
  kInterrupted,  // `wake_fd` became readable first (a signal arrived)
};

struct ConnectResult {
  ConnectStatus status = ConnectStatus::kFailed;
  std::optional<NodeLink> link;
  std::string error;
};

// One attempt to connect to each address of host:port in turn, for at most `timeout` in all; gives
// up early when `wake_fd` becomes readable (-1: never).
ConnectResult connect_link(const std::string& host, int port, std::chrono::milliseconds timeout, int wake_fd,
                           const std::string& secret);

// Every address `host` resolves to is a loopback one (127.0.0.0/8, ::1): the job is on this host.
bool is_loopback_host(const std::string& host);

// For such a host, the first address it resolves to, numeric ("127.0.0.1", "::1"): where node 0
// listens, so that a --master_addr of ::1 is reached over IPv6 (the other nodes try each address of
// the host in turn). Nullopt when the host is not on the loopback alone or does not resolve.
std::optional<std::string> loopback_listen_address(const std::string& host);

}  // namespace cpprun::launcher
