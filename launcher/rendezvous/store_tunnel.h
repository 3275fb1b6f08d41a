// The store tunnel's channels on one agent link, as a pure state machine: the workers' connections
// to their c10d store travel as `open`/`data`/`credit`/`close` messages (node_messages.h) on the
// authenticated link instead of reaching the store across the network. A member agent accepts each
// worker connection on its loopback listener and opens a channel for it; the host agent connects
// each channel to the store on its own loopback. The bytes are opaque: the tunnel never parses the
// store's protocol. TunnelState only decides; an executor does the sockets and the link, and feeds
// back what happened, so every rule is unit-tested without a socket (as admission.h, round_plan.h).
//
// Its executor, and how the agents use it: Note [Store tunnel wired] in store_tunnel_io.h.
//
// Note [Store tunnel flow control]
// Each channel has a window of kChannelWindowBytes in each direction: a sender never has more than
// that sent and not yet credited back, and the receiver credits bytes back once they are written to
// its own socket (in batches of kCreditReturnBytes, so that a store's small requests and answers do
// not each cost a `credit`). A channel without credit is not read: the bytes wait in the worker's or
// the store's own socket buffers. So what a peer can make an agent hold is bounded: per channel one
// window it received (waiting to be written) and one read (waiting for credit), and
// tunnel_channel_cap() channels per link. A peer that sends beyond its credit, or breaks any other
// rule below, gets a kViolation: the link is closed, as for any message that is not our protocol
// (node_link.h).
#pragma once

#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "rendezvous/node_link.h"
#include "rendezvous/node_messages.h"

namespace cpprun::launcher {

// Bytes a sender may have sent on a channel and not yet had credited back.
inline constexpr std::size_t kChannelWindowBytes = 128 * 1024;
// Written bytes the receiver collects before it sends them back as one `credit`.
inline constexpr std::size_t kCreditReturnBytes = kChannelWindowBytes / 2;
// Note [Channels a node may hold]
// Channels open at once on one link: a worker holds one store connection for its life (PyTorch's
// and cpprun's clients alike), some two or three, so the cap grows with the member's workers, as both
// agents know them from its hello: 3 per worker and 64 more, at least 256, at most 2048 (a node of
// ~660 workers). The upper bound keeps what a peer holding the secret can make node 0 hold per link
// to 2048 channels x a window each way (128 KiB): 512 MiB, where a fixed 256 gave 64 MiB. That
// fixed 256 once left the 257th worker of a big node waiting in the listener's backlog until its
// store timeout. At the cap the member leaves new connections in the backlog (one is taken again
// when a channel closes) and says so, once a link; a host that is asked for one more treats it as
// a violation.
inline constexpr std::size_t kMinChannelCap = 256;
inline constexpr std::size_t kMaxChannelCap = 2048;
std::size_t tunnel_channel_cap(int local_world_size);

enum class ChannelState {
  kConnecting,   // host: the store connection is under way; the peer's bytes wait here, within the credit
  kOpen,         // both ends are up: bytes flow both ways within the credit
  kLocalClosed,  // our socket ended and is closed: what was read of it goes out as credit comes, then `close`
  kPeerClosed,   // the peer sent `close`: what it sent is still being written to our socket, then it closes
};

struct TunnelAction {
  enum class Kind {
    kSendPeer,         // send `message` on the link
    kAdoptLocal,       // member: the connection just accepted is `channel`; read it
    kRefuseLocal,      // member: close the connection just accepted (no round runs, or the cap is reached)
    kConnectStore,     // host: connect `channel` to the store (non-blocking); report connected or refused
    kWriteLocal,       // write `bytes` to `channel`'s socket, after what it was given before; report each write
    kCloseLocal,       // close `channel`'s socket (or abandon its connect), dropping what it has not written
    kPauseReading,     // do not read `channel`'s socket: it has no credit
    kResumeReading,    // read it again
    kStopAccepting,    // member: the cap's channels are open: leave new connections in the listener's backlog
    kResumeAccepting,  // member: one closed: accept again
    kViolation,        // the peer broke the protocol (`why`, after the peer's name: "sent ..."): close the link
  };
  Kind kind = Kind::kSendPeer;
  int channel = 0;
  std::string bytes{};     // kWriteLocal
  NodeMessage message{};   // kSendPeer
  std::string why{};       // kViolation
};

// One side of one link's tunnel. Channel ids are numbered from 1 by the member, in the order it
// accepts connections, and are never reused on a link. A channel belongs to the running round: a
// round's end closes its channels, and an `open` that names another round is closed at once (a
// straggler of round N never reaches round N+1's store; not a violation, rounds change under way).
// After a violation or the link's loss every channel is closed and the state takes nothing more.
//
// An executor reads a channel's socket once it is adopted (member) or connected (host) and until it
// is paused or closed, at most kMaxTunnelChunkBytes at a time. An event for a channel that is not
// open here any more (it was told to close it in the meantime) is dropped.
class TunnelState {
 public:
  // kMember opens channels (it accepts the workers' connections); kHost connects them to the store.
  // `max_channels`: tunnel_channel_cap() of the member's workers, the same on both sides.
  TunnelState(LinkSide side, std::size_t max_channels) : side_(side), max_channels_(max_channels) {}

  // The round whose workers may use the tunnel now; channels of an earlier round are closed.
  std::vector<TunnelAction> on_round_started(int round);
  // Round `round` is over: its channels are closed (and the peer told), and no `open` is taken until
  // the next round starts. Another round's end changes nothing.
  std::vector<TunnelAction> on_round_ended(int round);

  // Member: its listener accepted a worker's connection.
  std::vector<TunnelAction> on_accepted();
  // Host: the store connection of `channel` is up, or could not be made (after any retries of the
  // executor's: refused, the worker's connection is closed).
  std::vector<TunnelAction> on_store_connected(int channel);
  std::vector<TunnelAction> on_store_refused(int channel);

  // `bytes` were read from `channel`'s socket; it reached its end (or failed); `n` bytes of what it
  // was given to write were written.
  std::vector<TunnelAction> on_local_bytes(int channel, const std::string& bytes);
  std::vector<TunnelAction> on_local_eof(int channel);
  std::vector<TunnelAction> on_local_written(int channel, std::size_t n);

  // One of the tunnel's messages (is_tunnel_kind) from the peer; std::logic_error for any other.
  std::vector<TunnelAction> on_peer(const NodeMessage& message);
  // The link is gone: every channel is closed.
  std::vector<TunnelAction> on_link_lost();

  // For the executor's poll and for tests.
  std::optional<ChannelState> channel_state(int channel) const;
  std::size_t open_channels() const { return channels_.size(); }
  std::size_t max_channels() const { return max_channels_; }
  bool accepting() const { return !stopped_accepting_; }
  bool link_closed() const { return link_closed_; }

 private:
  struct Channel {
    ChannelState state = ChannelState::kOpen;
    std::size_t send_credit = kChannelWindowBytes;  // bytes we may still send
    std::string unsent;                             // read from our socket, waiting for credit
    bool paused = false;                            // kPauseReading was the last word on reading
    std::size_t received = 0;                       // from the peer, not yet credited back
    std::size_t unwritten = 0;                      // handed to kWriteLocal, not yet written
    std::size_t written = 0;                        // written, not yet credited back
    std::string waiting;                            // host, kConnecting: the peer's bytes until the store is up
    bool closed_while_connecting = false;           // host: the peer's `close` came before the store was up
  };
  using Actions = std::vector<TunnelAction>;

  void on_open(const NodeMessage& m, Actions& out);
  void on_data(int id, Channel& ch, const std::string& bytes, Actions& out);
  void on_credit(int id, Channel& ch, int credit, Actions& out);
  void on_close(int id, Channel& ch, Actions& out);
  // Sends what was read as far as the credit goes, pauses or resumes reading to match, and sends
  // `close` once a channel whose socket ended has sent it all.
  void send_unsent(int id, Channel& ch, Actions& out);
  void forget(int id, Actions& out);
  // Closes every channel; `tell_peer`: the link still works, so the peer hears of each.
  void close_all(bool tell_peer, Actions& out);
  Actions violation(std::string why);

  LinkSide side_;  // not const: a member's StoreTunnel starts over with a fresh state on a new link
  std::size_t max_channels_;  // tunnel_channel_cap(): Note [Channels a node may hold]
  std::map<int, Channel> channels_;  // the open ones, by id
  int last_channel_ = 0;             // the highest id opened on this link: ids above it were never opened
  std::optional<int> round_;         // the round whose channels may be opened
  bool stopped_accepting_ = false;
  bool link_closed_ = false;
};

}  // namespace cpprun::launcher
