// The store tunnel's executor for one agent link: the sockets TunnelState (store_tunnel.h) decides
// about. On a member, a loopback listener per round that the node's workers reach as MASTER_ADDR:
// MASTER_PORT, and the connections it accepts; on the host, one connection per channel to worker
// store keeper's socket on the host's loopback. It carries out TunnelState's actions, feeds it what the
// sockets did, and offers its descriptors to the agent's poll() (PeerEvents::poll_fds), so that the
// loops that read the link -- while workers run, and outside an attempt (the exit barrier too) --
// move the store's bytes as well.
//
// Note [Store tunnel wired]
// With a job secret, every node's workers reach the workers' c10d store (the host agent's store
// keeper's: Note [Workers' store] in node_rendezvous.h) only at their own node's loopback:
// MASTER_ADDR is 127.0.0.1 everywhere (::1 for a job meeting at an IPv6 address, or on a host
// without IPv4 loopback). The host node's workers reach the keeper there directly (the host agent
// bound its socket on the loopback alone); another node's reach their agent's listener, which tries
// the host's MASTER_PORT first (unless the host agent is on this machine, where that port is the
// keeper's), and their bytes travel on the authenticated link (`open`/`data`/`credit`/`close`). The
// host agent connects each channel to the store's socket, which listens from the round's start; it
// still never resets the worker's connection should a connect be refused (the keeper ended, a
// descriptor shortage): it retries (50 ms doubling to 1 s) while the state machine holds the
// worker's first bytes within the channel's credit. A round's listener and channels are closed
// before the next round's workers start; the link's loss closes every channel. Tunnel data is read
// from a socket only while the link has room for bulk data (Note [The link's outbound queue] in
// node_link.h): otherwise the bytes wait in the socket's buffers.
//
// Note [Store tunnel out of descriptors]
// An agent out of descriptors (EMFILE, ENFILE: ulimit -n) cannot accept a worker's connection or
// open one to the store. It says so once, naming the limit, and tries again later rather than at
// once: a member's listener stays readable while accept4 fails, so it is left out of the poll for
// kAcceptPause (the connections wait in the backlog), and the host retries the connect as for a
// store not up yet. Both wake on the tunnel's timerfd, made when the round starts, before the
// descriptors ran out.
#pragma once

#include <poll.h>

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "rendezvous/node_link.h"
#include "rendezvous/store_tunnel.h"

namespace cpprun::launcher {

struct LoopbackEndpoint {
  std::string address;  // numeric: "127.0.0.1", or "::1"
  int port = 0;
};

// Which loopback the workers' MASTER_ADDR is: 127.0.0.1, or ::1 for a job whose agents meet at an
// IPv6 address (--master_addr, --rdzv_endpoint); the other where this host lacks that one.
enum class LoopbackFamily { kIpv4, kIpv6 };
LoopbackFamily loopback_family_for(const std::string& meeting_host);

// Whether connected socket `fd`'s own address is its peer's: a connect to a free port of this
// machine that the kernel gave that same port as its source meets itself (TCP simultaneous open).
// The host's retried connects to a store port that is free (its keeper gone) can do that.
bool connected_to_itself(int fd);

// A port free now on this machine's loopback of `family` (else the other's), bound and closed again
// (for tests: the store's own socket is bound and held by its keeper, workers/store_keeper.h).
// Throws std::system_error when neither can be bound.
LoopbackEndpoint free_loopback_port(LoopbackFamily family);

class StoreTunnel {
 public:
  // `max_channels`: tunnel_channel_cap() of the member's workers (Note [Channels a node may hold]).
  StoreTunnel(LinkSide side, std::size_t max_channels) : state_(side, max_channels), side_(side) {}
  StoreTunnel(const StoreTunnel&) = delete;
  StoreTunnel& operator=(const StoreTunnel&) = delete;

  // Member: round `round`'s workers are about to start. Closes the previous round's listener and
  // channels, and listens on the loopback of `family` at `preferred_port` (0: none), else where the
  // kernel picks. Returns where: the workers' MASTER_ADDR and MASTER_PORT. Throws std::system_error.
  LoopbackEndpoint listen_for_round(int round, LoopbackFamily family, int preferred_port, NodeLink& link);
  // Host: round `round`'s channels connect to `store` (the round's keeper's); earlier ones are closed.
  void serve_round(int round, const LoopbackEndpoint& store, NodeLink& link);
  // Round `round` is over: its channels (and a member's listener) are closed.
  void end_round(int round, NodeLink& link);

  // A tunnel message from the peer (is_tunnel_kind). Returns what the peer did wrong ("sent ..."), or
  // "": after a violation the caller closes the link.
  std::string on_peer(const NodeMessage& message, NodeLink& link);
  // The link is gone: every channel and the listener are closed.
  void on_link_lost();
  // Member: join() replaced a link the host dropped before its handshake with a new one (Note
  // [Pending links under a flood]). The tunnel starts over on it, as the host's does for each new
  // node's link: the old link's loss closed nothing that the new one needs.
  void on_new_link();

  // What to poll: the listener, the retry timer, and each channel's socket, for reading only while
  // `link` has room for bulk data.
  void add_poll_fds(const NodeLink& link, std::vector<pollfd>& fds) const;
  bool owns(int fd) const;
  // `fd`, one of add_poll_fds()'s, after a poll(). Returns a violation as on_peer() does (none can
  // come from a socket, but the actions are carried out alike).
  std::string on_ready(int fd, short revents, NodeLink& link);

  std::size_t open_sockets() const { return sockets_.size(); }

 private:
  struct Socket {
    OwnedFd fd;
    std::string out;          // given to write, not yet written
    bool reading = false;     // adopted or connected, and not paused
    bool connecting = false;  // host: connect() under way
    int refusals = 0;         // host: connects refused so far
    std::optional<Clock::time_point> retry_at;  // host: connect again then
  };

  // Carries the actions out, and those that what they did leads to; returns the first violation.
  std::string carry_out(std::vector<TunnelAction> actions, NodeLink& link);
  void connect_store(int channel, std::vector<TunnelAction>& next);
  void connect_finished(int channel, int error, std::vector<TunnelAction>& next);
  void read_socket(int channel, std::vector<TunnelAction>& next);
  void write_socket(int channel, std::vector<TunnelAction>& next);
  void accept_workers(NodeLink& link, std::string& violation);
  void retry_due(std::vector<TunnelAction>& next);
  // The timer exists from the round's start (Note [Store tunnel out of descriptors]).
  void ensure_timer();
  void arm_timer();
  // Says once on this tunnel that `what` failed with `error`, this agent's descriptors spent.
  void tell_out_of_descriptors(const std::string& what, int error);

  TunnelState state_;
  const LinkSide side_;
  bool told_at_cap_ = false;  // member: the warning that the cap's channels are open, once a link
  std::map<int, Socket> sockets_;  // by channel
  OwnedFd listener_;               // member: this round's
  bool accepting_ = true;
  std::optional<Clock::time_point> accept_again_at_;  // member: out of descriptors, the listener rests till then
  bool told_out_of_descriptors_ = false;
  OwnedFd accepted_;               // member: the connection on_accepted() is deciding about
  OwnedFd timer_;                  // a timerfd: the host's connect retries, the member's accept pause
  LoopbackEndpoint store_;         // host: the round's store keeper's socket
};

}  // namespace cpprun::launcher
