// Unit tests of the store tunnel's channels (rendezvous/store_tunnel.h), without a socket: a member's
// and a host's TunnelState wired together through the wire's encoding, with fake sockets that record
// what the actions ask. Credit and pausing, closing from either end, rounds, the channel cap, and
// every rule whose breach closes the link.
#include "catch.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "rendezvous/store_tunnel.h"

using namespace cpprun::launcher;
using Kind = TunnelAction::Kind;

namespace {

// One agent's side of the tunnel, its sockets faked: it keeps what each action asked for.
struct Side {
  explicit Side(LinkSide side, std::size_t cap = kMinChannelCap) : state(side, cap) {}

  TunnelState state;
  std::vector<NodeMessage> to_peer;     // sent on the link, not yet delivered
  std::map<int, std::string> unwritten;  // given to a socket to write, not yet written
  std::map<int, std::string> written;    // written to each channel's socket
  std::set<int> adopted, connecting, closed, paused;
  int refused = 0;
  bool accepting = true;
  std::vector<std::string> violations;

  void apply(const std::vector<TunnelAction>& actions) {
    for (const TunnelAction& a : actions) {
      switch (a.kind) {
        case Kind::kSendPeer:
          to_peer.push_back(a.message);
          break;
        case Kind::kAdoptLocal:
          CHECK(adopted.insert(a.channel).second);
          break;
        case Kind::kRefuseLocal:
          ++refused;
          break;
        case Kind::kConnectStore:
          CHECK(connecting.insert(a.channel).second);
          break;
        case Kind::kWriteLocal:
          CHECK_FALSE(closed.count(a.channel));
          unwritten[a.channel] += a.bytes;
          break;
        case Kind::kCloseLocal:
          CHECK(closed.insert(a.channel).second);  // each socket is closed once
          unwritten.erase(a.channel);
          break;
        case Kind::kPauseReading:
          CHECK(paused.insert(a.channel).second);
          break;
        case Kind::kResumeReading:
          CHECK(paused.erase(a.channel) == 1);
          break;
        case Kind::kStopAccepting:
          CHECK(accepting);
          accepting = false;
          break;
        case Kind::kResumeAccepting:
          CHECK_FALSE(accepting);
          accepting = true;
          break;
        case Kind::kViolation:
          violations.push_back(a.why);
          break;
      }
    }
  }

  // Channel `ch`'s socket writes `n` bytes of what it was given (all of it by default).
  void drain(int ch, std::size_t n = std::string::npos) {
    std::string& pending = unwritten[ch];
    n = std::min(n, pending.size());
    written[ch] += pending.substr(0, n);
    pending.erase(0, n);
    apply(state.on_local_written(ch, n));
  }

  // The credits it sent, by channel, in order.
  std::vector<int> credits_sent() const {
    std::vector<int> credits;
    for (const NodeMessage& m : to_peer) {
      if (m.kind == MessageKind::kCredit) credits.push_back(m.credit);
    }
    return credits;
  }
};

// Delivers what `from` sent to `to`, each message through its line on the wire.
void deliver(Side& from, Side& to) {
  for (const NodeMessage& m : std::exchange(from.to_peer, {})) {
    std::string why;
    const std::optional<NodeMessage> back = decode_message(encode_message(m), &why);
    INFO(why);
    REQUIRE(back);
    to.apply(to.state.on_peer(*back));
  }
}

// Until neither side has anything left to say.
void settle(Side& member, Side& host) {
  while (!member.to_peer.empty() || !host.to_peer.empty()) {
    deliver(member, host);
    deliver(host, member);
  }
}

struct Tunnel {
  Side member{LinkSide::kMember};
  Side host{LinkSide::kHost};

  explicit Tunnel(int round = 0) {
    member.apply(member.state.on_round_started(round));
    host.apply(host.state.on_round_started(round));
  }

  // A worker connects on the member, the host's store connection comes up: the channel's id.
  int connect() {
    member.apply(member.state.on_accepted());
    REQUIRE(member.to_peer.size() == 1);
    const int id = member.to_peer.back().channel;
    settle(member, host);
    REQUIRE(host.connecting.count(id));
    host.apply(host.state.on_store_connected(id));
    return id;
  }
};

std::string bytes_of(std::size_t n, char c = 'x') { return std::string(n, c); }

std::size_t data_sent(const Side& side, int ch) {
  std::size_t n = 0;
  for (const NodeMessage& m : side.to_peer) {
    if (m.kind == MessageKind::kData && m.channel == ch) {
      CHECK(m.bytes.size() <= kMaxTunnelChunkBytes);
      n += m.bytes.size();
    }
  }
  return n;
}

// A host with channel 1 open (its store connected), fed messages straight from a member.
struct HostWithChannel {
  Side host{LinkSide::kHost};
  HostWithChannel() {
    host.apply(host.state.on_round_started(0));
    host.apply(host.state.on_peer(NodeMessage::make_open(0, 1)));
    host.apply(host.state.on_store_connected(1));
    REQUIRE(host.state.channel_state(1) == ChannelState::kOpen);
  }
  // The peer's `message` breaks a rule: the link is closed, with `why` naming it, and every channel.
  void expect_violation(const NodeMessage& message, const std::string& why) {
    const std::vector<TunnelAction> actions = host.state.on_peer(message);
    host.apply(actions);
    REQUIRE_FALSE(actions.empty());
    CHECK(actions.front().kind == Kind::kViolation);
    CHECK(actions.front().why == why);
    CHECK(host.state.link_closed());
    CHECK(host.state.open_channels() == 0);
    CHECK(host.closed.count(1));
    for (const TunnelAction& a : actions) CHECK(a.kind != Kind::kSendPeer);  // nothing more is said on a broken link
    CHECK(host.state.on_peer(NodeMessage::make_close(1)).empty());  // and nothing more taken
  }
};

}  // namespace

TEST_CASE("store_tunnel: a worker's connection reaches the store and back through two agents", "[store_tunnel]") {
  Tunnel t(3);
  t.member.apply(t.member.state.on_accepted());
  CHECK(t.member.adopted == std::set<int>{1});
  REQUIRE(t.member.to_peer.size() == 1);
  CHECK(encode_message(t.member.to_peer[0]) == "open 3 1");
  t.member.apply(t.member.state.on_local_bytes(1, "VALIDATE and a ping"));  // the worker speaks at once
  settle(t.member, t.host);
  CHECK(t.host.connecting == std::set<int>{1});
  CHECK(t.host.state.channel_state(1) == ChannelState::kConnecting);
  CHECK(t.host.unwritten[1].empty());  // the store is not up yet: the bytes wait, the worker is not reset
  CHECK(t.member.closed.empty());

  t.host.apply(t.host.state.on_store_connected(1));
  CHECK(t.host.state.channel_state(1) == ChannelState::kOpen);
  CHECK(t.host.unwritten[1] == "VALIDATE and a ping");
  t.host.drain(1);
  CHECK(t.host.written[1] == "VALIDATE and a ping");
  CHECK(t.host.to_peer.empty());  // a few bytes written: no credit yet (kCreditReturnBytes)

  t.host.apply(t.host.state.on_local_bytes(1, std::string("pong\0\n", 6)));  // any bytes
  settle(t.member, t.host);
  t.member.drain(1);
  CHECK(t.member.written[1] == std::string("pong\0\n", 6));

  // The worker hangs up: its channel closes at both ends, and the store connection with it.
  t.member.apply(t.member.state.on_local_eof(1));
  CHECK(t.member.closed == std::set<int>{1});
  settle(t.member, t.host);
  CHECK(t.host.closed == std::set<int>{1});
  CHECK(t.member.state.open_channels() == 0);
  CHECK(t.host.state.open_channels() == 0);
  CHECK(t.member.violations.empty());
  CHECK(t.host.violations.empty());
}

// A client that writes and closes at once, before node 0's store connection is up: what it wrote
// still reaches the store, then the channel closes (it was dropped: an audit, 2026-12-07).
TEST_CASE("store_tunnel: a worker that writes and closes before the store is up still delivers", "[store_tunnel]") {
  Tunnel t;
  t.member.apply(t.member.state.on_accepted());
  t.member.apply(t.member.state.on_local_bytes(1, "VALIDATE and a set"));
  t.member.apply(t.member.state.on_local_eof(1));
  settle(t.member, t.host);
  CHECK(t.member.state.open_channels() == 0);
  CHECK(t.host.state.channel_state(1) == ChannelState::kConnecting);
  CHECK(t.host.closed.empty());  // not forgotten: its bytes wait for the store
  t.host.apply(t.host.state.on_store_connected(1));
  CHECK(t.host.unwritten[1] == "VALIDATE and a set");
  CHECK(t.host.closed.empty());
  t.host.drain(1);
  CHECK(t.host.written[1] == "VALIDATE and a set");
  CHECK(t.host.closed == std::set<int>{1});  // closed once written
  CHECK(t.host.state.open_channels() == 0);
  CHECK(t.host.to_peer.empty());  // the member forgot the channel: no `close` goes back
  CHECK(t.host.violations.empty());

  // Nothing written: closed at once, as before; and a store that refuses a closed one says nothing back.
  t.member.apply(t.member.state.on_accepted());
  t.member.apply(t.member.state.on_local_eof(2));
  settle(t.member, t.host);
  CHECK(t.host.state.open_channels() == 0);
  t.member.apply(t.member.state.on_accepted());
  t.member.apply(t.member.state.on_local_bytes(3, "bytes"));
  t.member.apply(t.member.state.on_local_eof(3));
  settle(t.member, t.host);
  t.host.apply(t.host.state.on_store_refused(3));
  CHECK(t.host.state.open_channels() == 0);
  CHECK(t.host.to_peer.empty());
  CHECK(t.host.violations.empty());
}

TEST_CASE("store_tunnel: the store's end closes the worker's connection once its bytes are written",
          "[store_tunnel]") {
  Tunnel t;
  const int ch = t.connect();
  t.host.apply(t.host.state.on_local_bytes(ch, "last answer"));
  t.host.apply(t.host.state.on_local_eof(ch));
  settle(t.member, t.host);
  CHECK(t.member.state.channel_state(ch) == ChannelState::kPeerClosed);
  CHECK(t.member.closed.empty());  // its last answer is still to be written
  t.member.drain(ch, 4);
  CHECK(t.member.closed.empty());
  t.member.drain(ch);
  CHECK(t.member.written[ch] == "last answer");
  CHECK(t.member.closed == std::set<int>{ch});
  CHECK(t.member.state.open_channels() == 0);

  // A store that cannot be reached: the worker's connection is closed (it retries), not left hanging.
  t.member.apply(t.member.state.on_accepted());
  settle(t.member, t.host);
  t.host.apply(t.host.state.on_store_refused(2));
  settle(t.member, t.host);
  CHECK(t.member.closed.count(2));
  CHECK(t.host.closed.count(2));
  CHECK(t.host.state.open_channels() == 0);
}

TEST_CASE("store_tunnel: a channel out of credit stops reading its socket until credit comes back",
          "[store_tunnel]") {
  Tunnel t;
  const int ch = t.connect();
  // The worker sends three reads' worth (the executor reads at most a chunk at a time): more than a window.
  for (int i = 0; i < 3; ++i) t.member.apply(t.member.state.on_local_bytes(ch, bytes_of(kMaxTunnelChunkBytes)));
  CHECK(data_sent(t.member, ch) == kChannelWindowBytes);  // never more than the window unacknowledged
  CHECK(t.member.paused == std::set<int>{ch});
  deliver(t.member, t.host);
  CHECK(t.host.unwritten[ch].size() == kChannelWindowBytes);

  // The store has not read it: no credit, the worker's socket stays unread.
  deliver(t.host, t.member);
  CHECK(t.member.paused == std::set<int>{ch});
  // Half a window written: credited back at once.
  t.host.drain(ch, kCreditReturnBytes - 1);
  CHECK(t.host.credits_sent().empty());
  t.host.drain(ch, 1);
  CHECK(t.host.credits_sent() == std::vector<int>{static_cast<int>(kCreditReturnBytes)});
  deliver(t.host, t.member);
  // The rest of the third read went out, and there is credit left: reading resumes.
  CHECK(data_sent(t.member, ch) == 3 * kMaxTunnelChunkBytes - kChannelWindowBytes);
  CHECK(t.member.paused.empty());
  deliver(t.member, t.host);
  t.host.drain(ch);
  CHECK(t.host.written[ch] == bytes_of(3 * kMaxTunnelChunkBytes));
  CHECK(t.member.violations.empty());
  CHECK(t.host.violations.empty());
}

TEST_CASE("store_tunnel: what a worker sent before hanging up still reaches the store as credit allows",
          "[store_tunnel]") {
  Tunnel t;
  const int ch = t.connect();
  for (int i = 0; i < 3; ++i) t.member.apply(t.member.state.on_local_bytes(ch, bytes_of(kMaxTunnelChunkBytes)));
  t.member.apply(t.member.state.on_local_eof(ch));
  CHECK(t.member.closed == std::set<int>{ch});
  CHECK(t.member.state.channel_state(ch) == ChannelState::kLocalClosed);
  deliver(t.member, t.host);
  t.host.drain(ch);
  deliver(t.host, t.member);  // the credit lets the rest go, then `close`
  CHECK(t.member.state.open_channels() == 0);
  deliver(t.member, t.host);
  CHECK(t.host.closed.empty());  // the worker's last bytes are written to the store first
  t.host.drain(ch);
  CHECK(t.host.written[ch] == bytes_of(3 * kMaxTunnelChunkBytes));
  CHECK(t.host.closed == std::set<int>{ch});
}

TEST_CASE("store_tunnel: data beyond the credit closes the link", "[store_tunnel]") {
  HostWithChannel h;
  h.host.apply(h.host.state.on_peer(NodeMessage::make_data(1, bytes_of(kMaxTunnelChunkBytes))));
  h.host.apply(h.host.state.on_peer(NodeMessage::make_data(1, bytes_of(kMaxTunnelChunkBytes))));
  REQUIRE(h.host.violations.empty());
  h.expect_violation(NodeMessage::make_data(1, bytes_of(kMaxTunnelChunkBytes)),
                     "sent 49152 bytes for channel 1 beyond its credit: 32768 of its 131072-byte window were left");
}

TEST_CASE("store_tunnel: a chunk too large, or empty, closes the link", "[store_tunnel]") {
  HostWithChannel().expect_violation(NodeMessage::make_data(1, bytes_of(kMaxTunnelChunkBytes + 1)),
                                     "sent data of 49153 bytes for channel 1; a message carries 1 to 49152");
  HostWithChannel().expect_violation(NodeMessage::make_data(1, ""),
                                     "sent data of 0 bytes for channel 1; a message carries 1 to 49152");
  // A chunk that is not base64 never becomes a message: the link refuses the line (node_link.cpp).
  std::string why;
  CHECK_FALSE(decode_message("data 1 ab$d", &why));
  CHECK(why == "sent data for channel 1 that is not base64");
}

TEST_CASE("store_tunnel: an open with an id not next in line, or from the host, closes the link", "[store_tunnel]") {
  HostWithChannel().expect_violation(NodeMessage::make_open(0, 1),
                                     "sent `open` for channel 1, but the next channel is 2 "
                                     "(ids count up from 1 and are never reused)");
  HostWithChannel().expect_violation(NodeMessage::make_open(0, 3),
                                     "sent `open` for channel 3, but the next channel is 2 "
                                     "(ids count up from 1 and are never reused)");

  Tunnel t;
  const int ch = t.connect();
  const std::vector<TunnelAction> actions = t.member.state.on_peer(NodeMessage::make_open(0, 2));
  t.member.apply(actions);
  REQUIRE(t.member.violations.size() == 1);
  CHECK(t.member.violations[0] == "sent `open` for channel 2, but only a member opens channels");
  CHECK(t.member.closed == std::set<int>{ch});
  CHECK(t.member.state.link_closed());
}

TEST_CASE("store_tunnel: credit beyond what was sent closes the link", "[store_tunnel]") {
  HostWithChannel().expect_violation(NodeMessage::make_credit(1, 1),
                                     "credited 1 bytes back for channel 1, but 0 were sent and not yet credited");
  HostWithChannel h;
  h.host.apply(h.host.state.on_local_bytes(1, bytes_of(100)));
  h.host.apply(h.host.state.on_peer(NodeMessage::make_credit(1, 60)));
  REQUIRE(h.host.violations.empty());
  h.expect_violation(NodeMessage::make_credit(1, 41),
                     "credited 41 bytes back for channel 1, but 40 were sent and not yet credited");
}

TEST_CASE("store_tunnel: anything for a channel never opened closes the link", "[store_tunnel]") {
  for (const NodeMessage& m : {NodeMessage::make_data(2, "x"), NodeMessage::make_credit(2, 1),
                               NodeMessage::make_close(2), NodeMessage::make_close(-1)}) {
    INFO(encode_message(m));
    HostWithChannel().expect_violation(m, std::string("sent `") + message_word(m.kind) + "` for channel " +
                                              std::to_string(m.channel) + ", which was never opened");
  }
  // On a member too: ids it never handed out.
  Tunnel t;
  t.connect();
  t.member.apply(t.member.state.on_peer(NodeMessage::make_data(7, "x")));
  CHECK(t.member.violations == std::vector<std::string>{"sent `data` for channel 7, which was never opened"});
}

TEST_CASE("store_tunnel: anything after the peer's own close closes the link", "[store_tunnel]") {
  HostWithChannel h;
  h.host.apply(h.host.state.on_peer(NodeMessage::make_data(1, "set")));  // not yet written when `close` comes
  h.host.apply(h.host.state.on_peer(NodeMessage::make_close(1)));
  REQUIRE(h.host.state.channel_state(1) == ChannelState::kPeerClosed);
  h.expect_violation(NodeMessage::make_data(1, "x"), "sent `data` for channel 1 after closing it");
}

TEST_CASE("store_tunnel: a 257th open channel closes the link", "[store_tunnel]") {
  Side host(LinkSide::kHost);
  host.apply(host.state.on_round_started(0));
  const int cap = static_cast<int>(kMinChannelCap);
  for (int id = 1; id <= cap; ++id) host.apply(host.state.on_peer(NodeMessage::make_open(0, id)));
  REQUIRE(host.violations.empty());
  CHECK(host.state.open_channels() == kMinChannelCap);
  host.apply(host.state.on_local_eof(5));  // one closes: room for one more
  host.apply(host.state.on_peer(NodeMessage::make_open(0, cap + 1)));
  REQUIRE(host.violations.empty());
  host.apply(host.state.on_peer(NodeMessage::make_open(0, cap + 2)));
  CHECK(host.violations == std::vector<std::string>{"opened channel 258 while 256 were open; at most 256 may be"});
  CHECK(host.closed.size() == kMinChannelCap + 1);  // every one, and the one closed before
}

// A channel the member closed while node 0's store connect was under way stays here until its bytes
// are delivered, but the member no longer counts it: it is not held against the cap (the member,
// at its cap again, opened one more, and the host called the link a breach of it).
TEST_CASE("store_tunnel: a channel closed before the store is up does not count against the cap",
          "[store_tunnel]") {
  Side host(LinkSide::kHost);
  host.apply(host.state.on_round_started(0));
  const int cap = static_cast<int>(kMinChannelCap);
  host.apply(host.state.on_peer(NodeMessage::make_open(0, 1)));
  host.apply(host.state.on_peer(NodeMessage::make_data(1, "VALIDATE and a set")));
  host.apply(host.state.on_peer(NodeMessage::make_close(1)));  // the store is not up yet
  for (int id = 2; id <= cap + 1; ++id) host.apply(host.state.on_peer(NodeMessage::make_open(0, id)));
  CHECK(host.violations.empty());
  CHECK(host.state.open_channels() == kMinChannelCap + 1);
  host.apply(host.state.on_peer(NodeMessage::make_open(0, cap + 2)));
  CHECK(host.violations == std::vector<std::string>{"opened channel 258 while 256 were open; at most 256 may be"});
}

// Note [Channels a node may hold]: a fixed cap of 256 left a node's 257th worker waiting in the
// listener's backlog until its store timeout.
TEST_CASE("store_tunnel: the channel cap grows with the member's workers, within bounds", "[store_tunnel]") {
  CHECK(tunnel_channel_cap(0) == kMinChannelCap);
  CHECK(tunnel_channel_cap(1) == kMinChannelCap);
  CHECK(tunnel_channel_cap(64) == kMinChannelCap);
  CHECK(tunnel_channel_cap(300) == 964);
  CHECK(tunnel_channel_cap(600) == 1864);
  CHECK(tunnel_channel_cap(2000) == kMaxChannelCap);
  CHECK(tunnel_channel_cap(65536) == kMaxChannelCap);
  CHECK(tunnel_channel_cap(-1) == kMinChannelCap);

  const std::size_t cap = tunnel_channel_cap(300);  // a node of 300 workers, each with a store connection or more
  Side member(LinkSide::kMember, cap);
  Side host(LinkSide::kHost, cap);
  member.apply(member.state.on_round_started(0));
  host.apply(host.state.on_round_started(0));
  for (std::size_t i = 0; i < cap; ++i) member.apply(member.state.on_accepted());
  CHECK(member.adopted.size() == cap);
  CHECK_FALSE(member.accepting);
  for (const NodeMessage& m : member.to_peer) host.apply(host.state.on_peer(m));
  CHECK(host.violations.empty());
  CHECK(host.state.open_channels() == cap);
  host.apply(host.state.on_peer(NodeMessage::make_open(0, static_cast<int>(cap) + 1)));
  CHECK(host.violations == std::vector<std::string>{"opened channel 965 while 964 were open; at most 964 may be"});
}

TEST_CASE("store_tunnel: data and credit in flight for a channel closed here are dropped", "[store_tunnel]") {
  Tunnel t;
  const int ch = t.connect();
  t.member.apply(t.member.state.on_local_bytes(ch, "get key"));
  deliver(t.member, t.host);
  t.host.drain(ch);
  // The store hangs up while the worker's next request and a credit are on their way.
  t.host.apply(t.host.state.on_local_eof(ch));
  CHECK(t.host.closed == std::set<int>{ch});
  t.host.to_peer.clear();  // the host's `close` is still on its way too
  for (const NodeMessage& m : {NodeMessage::make_data(ch, "set key"), NodeMessage::make_credit(ch, 7),
                               NodeMessage::make_close(ch)}) {
    INFO(encode_message(m));
    CHECK(t.host.state.on_peer(m).empty());
  }
  CHECK_FALSE(t.host.state.link_closed());
}

TEST_CASE("store_tunnel: an open for another round is closed, without a violation", "[store_tunnel]") {
  Side host(LinkSide::kHost);
  host.apply(host.state.on_round_started(2));
  host.apply(host.state.on_peer(NodeMessage::make_open(1, 1)));  // a straggler of round 1
  CHECK(host.violations.empty());
  CHECK(host.connecting.empty());
  REQUIRE(host.to_peer.size() == 1);
  CHECK(encode_message(host.to_peer[0]) == "close 1");
  host.apply(host.state.on_peer(NodeMessage::make_data(1, "x")));  // its bytes, in flight: dropped
  CHECK(host.violations.empty());
  host.apply(host.state.on_peer(NodeMessage::make_open(2, 2)));
  CHECK(host.connecting == std::set<int>{2});

  // Between rounds, no open is taken; the round's channels were closed and the member told.
  host.to_peer.clear();
  host.apply(host.state.on_round_ended(2));
  CHECK(host.closed == std::set<int>{2});
  REQUIRE(host.to_peer.size() == 1);
  CHECK(encode_message(host.to_peer[0]) == "close 2");
  host.apply(host.state.on_peer(NodeMessage::make_open(2, 3)));
  CHECK(host.connecting == std::set<int>{2});
  CHECK(host.violations.empty());
}

TEST_CASE("store_tunnel: a round's end closes its channels at both ends", "[store_tunnel]") {
  Tunnel t(4);
  t.connect();
  t.connect();
  // Both agents end the round at about the same time: their `close`s cross, and are dropped.
  t.member.apply(t.member.state.on_round_ended(4));
  t.host.apply(t.host.state.on_round_ended(4));
  CHECK(t.member.closed == std::set<int>{1, 2});
  CHECK(t.host.closed == std::set<int>{1, 2});
  settle(t.member, t.host);
  CHECK(t.member.violations.empty());
  CHECK(t.host.violations.empty());
  // No round runs: a connection that still comes is refused.
  t.member.apply(t.member.state.on_accepted());
  CHECK(t.member.refused == 1);
}

TEST_CASE("store_tunnel: the link's loss closes every channel", "[store_tunnel]") {
  Tunnel t;
  for (int i = 0; i < 3; ++i) t.connect();
  t.host.apply(t.host.state.on_peer(NodeMessage::make_open(0, 4)));  // one still connecting to the store
  for (Side* side : {&t.member, &t.host}) {
    side->apply(side->state.on_link_lost());
    CHECK(side->state.open_channels() == 0);
    CHECK(side->to_peer.empty());  // nobody to tell
    CHECK(side->state.link_closed());
  }
  CHECK(t.member.closed == std::set<int>{1, 2, 3});
  CHECK(t.host.closed == std::set<int>{1, 2, 3, 4});
  t.member.apply(t.member.state.on_accepted());
  CHECK(t.member.refused == 1);
}

TEST_CASE("store_tunnel: at the channel cap the member stops accepting, and resumes when one closes",
          "[store_tunnel]") {
  Side member(LinkSide::kMember);
  member.apply(member.state.on_round_started(0));
  for (std::size_t i = 0; i < kMinChannelCap; ++i) {
    CHECK(member.accepting);
    member.apply(member.state.on_accepted());
  }
  CHECK_FALSE(member.accepting);
  CHECK_FALSE(member.state.accepting());
  member.apply(member.state.on_accepted());  // one the executor had accepted anyway: refused, no id spent
  CHECK(member.refused == 1);
  CHECK(member.adopted.size() == kMinChannelCap);
  member.apply(member.state.on_local_eof(10));
  CHECK(member.accepting);
  member.to_peer.clear();
  member.apply(member.state.on_accepted());
  REQUIRE(member.to_peer.size() == 1);
  CHECK(member.to_peer[0].channel == static_cast<int>(kMinChannelCap) + 1);
  CHECK_FALSE(member.accepting);
}

TEST_CASE("store_tunnel: channel ids are never reused on a link, across rounds too", "[store_tunnel]") {
  Tunnel t(0);
  CHECK(t.connect() == 1);
  CHECK(t.connect() == 2);
  t.member.apply(t.member.state.on_local_eof(2));
  settle(t.member, t.host);
  CHECK(t.connect() == 3);
  t.member.apply(t.member.state.on_round_started(1));
  t.host.apply(t.host.state.on_round_started(1));
  settle(t.member, t.host);
  CHECK(t.member.state.open_channels() == 0);
  CHECK(t.host.state.open_channels() == 0);
  CHECK(t.connect() == 4);
  // A member that tried an old id again is refused.
  t.host.apply(t.host.state.on_peer(NodeMessage::make_open(1, 2)));
  REQUIRE(t.host.violations.size() == 1);
  CHECK(t.host.violations[0] ==
        "sent `open` for channel 2, but the next channel is 5 (ids count up from 1 and are never reused)");
}
