// The store tunnel's channel rules: credit, the channel cap, closing, and what a peer may not send.
#include "rendezvous/store_tunnel.h"

#include <algorithm>
#include <stdexcept>
#include <utility>

namespace cpprun::launcher {
namespace {

using Kind = TunnelAction::Kind;

TunnelAction act(Kind kind, int channel = 0) {
  TunnelAction a;
  a.kind = kind;
  a.channel = channel;
  return a;
}

TunnelAction send(NodeMessage message) {
  TunnelAction a = act(Kind::kSendPeer, message.channel);
  a.message = std::move(message);
  return a;
}

std::string channel_words(int id) { return "channel " + std::to_string(id); }

}  // namespace

std::optional<ChannelState> TunnelState::channel_state(int channel) const {
  const auto it = channels_.find(channel);
  if (it == channels_.end()) return std::nullopt;
  return it->second.state;
}

std::vector<TunnelAction> TunnelState::on_round_started(int round) {
  Actions out;
  if (link_closed_ || round_ == round) return out;
  close_all(/*tell_peer=*/true, out);  // an earlier round's, if any is left
  round_ = round;
  return out;
}

std::vector<TunnelAction> TunnelState::on_round_ended(int round) {
  Actions out;
  if (link_closed_ || round_ != round) return out;
  close_all(/*tell_peer=*/true, out);
  round_.reset();
  return out;
}

std::size_t tunnel_channel_cap(int local_world_size) {
  const std::size_t wanted = 3 * static_cast<std::size_t>(std::max(local_world_size, 0)) + 64;
  return std::clamp(wanted, kMinChannelCap, kMaxChannelCap);
}

std::vector<TunnelAction> TunnelState::on_accepted() {
  if (side_ != LinkSide::kMember) throw std::logic_error("store tunnel: only a member accepts workers' connections");
  if (link_closed_ || !round_ || channels_.size() >= max_channels_) return {act(Kind::kRefuseLocal)};
  const int id = ++last_channel_;
  channels_[id] = Channel{};
  Actions out{act(Kind::kAdoptLocal, id), send(NodeMessage::make_open(*round_, id))};
  if (channels_.size() == max_channels_) {
    stopped_accepting_ = true;
    out.push_back(act(Kind::kStopAccepting));
  }
  return out;
}

std::vector<TunnelAction> TunnelState::on_store_connected(int channel) {
  Actions out;
  const auto it = channels_.find(channel);
  if (link_closed_ || it == channels_.end() || it->second.state != ChannelState::kConnecting) return out;
  Channel& ch = it->second;
  ch.state = ChannelState::kOpen;
  if (!ch.waiting.empty()) {  // what the worker sent before the store was up
    ch.unwritten += ch.waiting.size();
    TunnelAction write = act(Kind::kWriteLocal, channel);
    write.bytes = std::exchange(ch.waiting, {});
    out.push_back(std::move(write));
  }
  // The worker closed meanwhile: its bytes are written, then the channel closes (on_local_written).
  if (ch.closed_while_connecting) ch.state = ChannelState::kPeerClosed;
  return out;
}

std::vector<TunnelAction> TunnelState::on_store_refused(int channel) {
  Actions out;
  const auto it = channels_.find(channel);
  if (link_closed_ || it == channels_.end() || it->second.state != ChannelState::kConnecting) return out;
  out.push_back(act(Kind::kCloseLocal, channel));
  if (!it->second.closed_while_connecting) out.push_back(send(NodeMessage::make_close(channel)));
  forget(channel, out);
  return out;
}

std::vector<TunnelAction> TunnelState::on_local_bytes(int channel, const std::string& bytes) {
  Actions out;
  const auto it = channels_.find(channel);
  if (link_closed_ || it == channels_.end() || it->second.state != ChannelState::kOpen) return out;  // else dropped
  it->second.unsent += bytes;
  send_unsent(channel, it->second, out);
  return out;
}

std::vector<TunnelAction> TunnelState::on_local_eof(int channel) {
  Actions out;
  const auto it = channels_.find(channel);
  if (link_closed_ || it == channels_.end()) return out;
  Channel& ch = it->second;
  switch (ch.state) {
    case ChannelState::kConnecting:
      return on_store_refused(channel);
    case ChannelState::kOpen:  // no half-close (the store's protocol needs none): what was read still goes out
      out.push_back(act(Kind::kCloseLocal, channel));
      ch.state = ChannelState::kLocalClosed;
      send_unsent(channel, ch, out);
      break;
    case ChannelState::kPeerClosed:  // the peer is gone already: nothing more to write
      out.push_back(act(Kind::kCloseLocal, channel));
      forget(channel, out);
      break;
    case ChannelState::kLocalClosed:
      break;
  }
  return out;
}

std::vector<TunnelAction> TunnelState::on_local_written(int channel, std::size_t n) {
  Actions out;
  const auto it = channels_.find(channel);
  if (link_closed_ || it == channels_.end()) return out;
  Channel& ch = it->second;
  if (ch.state != ChannelState::kOpen && ch.state != ChannelState::kPeerClosed) return out;
  if (n > ch.unwritten) {
    throw std::logic_error("store tunnel: " + channel_words(channel) + " wrote " + std::to_string(n) +
                           " bytes, but only " + std::to_string(ch.unwritten) + " were given to it");
  }
  ch.unwritten -= n;
  if (ch.state == ChannelState::kPeerClosed) {  // flushing what the peer sent before its `close`
    if (ch.unwritten == 0) {
      out.push_back(act(Kind::kCloseLocal, channel));
      forget(channel, out);
    }
    return out;
  }
  ch.written += n;
  if (ch.written >= kCreditReturnBytes) {  // Note [Store tunnel flow control]
    out.push_back(send(NodeMessage::make_credit(channel, static_cast<int>(ch.written))));
    ch.received -= ch.written;
    ch.written = 0;
  }
  return out;
}

std::vector<TunnelAction> TunnelState::on_peer(const NodeMessage& m) {
  if (!is_tunnel_kind(m.kind)) throw std::logic_error("store tunnel: given a message that is not the tunnel's");
  Actions out;
  if (link_closed_) return out;
  if (m.kind == MessageKind::kOpen) {
    on_open(m, out);
    return out;
  }
  if (m.channel < 1 || m.channel > last_channel_) {
    return violation(std::string("sent `") + message_word(m.kind) + "` for " + channel_words(m.channel) +
                     ", which was never opened");
  }
  const auto it = channels_.find(m.channel);
  if (it == channels_.end()) return out;  // closed here while this was on its way: dropped
  Channel& ch = it->second;
  if (ch.state == ChannelState::kPeerClosed || ch.closed_while_connecting) {
    return violation(std::string("sent `") + message_word(m.kind) + "` for " + channel_words(m.channel) +
                     " after closing it");
  }
  if (m.kind == MessageKind::kData) on_data(m.channel, ch, m.bytes, out);
  if (m.kind == MessageKind::kCredit) on_credit(m.channel, ch, m.credit, out);
  if (m.kind == MessageKind::kClose) on_close(m.channel, ch, out);
  return out;
}

void TunnelState::on_open(const NodeMessage& m, Actions& out) {
  if (side_ == LinkSide::kMember) {
    out = violation("sent `open` for " + channel_words(m.channel) + ", but only a member opens channels");
    return;
  }
  if (m.channel != last_channel_ + 1) {
    out = violation("sent `open` for " + channel_words(m.channel) + ", but the next channel is " +
                    std::to_string(last_channel_ + 1) + " (ids count up from 1 and are never reused)");
    return;
  }
  last_channel_ = m.channel;
  if (round_ != m.round) {  // a straggler of another round, or between rounds: not this round's store
    out.push_back(send(NodeMessage::make_close(m.channel)));
    return;
  }
  // The peer counts the channels it has not closed; a channel it closed that still delivers here
  // (closed_while_connecting, kPeerClosed) is no longer among them.
  std::size_t peer_open = 0;
  for (const auto& entry : channels_) {
    peer_open += entry.second.state != ChannelState::kPeerClosed && !entry.second.closed_while_connecting;
  }
  if (peer_open >= max_channels_) {
    out = violation("opened " + channel_words(m.channel) + " while " + std::to_string(peer_open) +
                    " were open; at most " + std::to_string(max_channels_) + " may be");
    return;
  }
  Channel& ch = channels_[m.channel];
  ch.state = ChannelState::kConnecting;
  out.push_back(act(Kind::kConnectStore, m.channel));
}

void TunnelState::on_data(int id, Channel& ch, const std::string& bytes, Actions& out) {
  if (bytes.empty() || bytes.size() > kMaxTunnelChunkBytes) {
    out = violation("sent data of " + std::to_string(bytes.size()) + " bytes for " + channel_words(id) +
                    "; a message carries 1 to " + std::to_string(kMaxTunnelChunkBytes));
    return;
  }
  const std::size_t credit = kChannelWindowBytes - ch.received;
  if (bytes.size() > credit) {
    out = violation("sent " + std::to_string(bytes.size()) + " bytes for " + channel_words(id) +
                    " beyond its credit: " + std::to_string(credit) + " of its " +
                    std::to_string(kChannelWindowBytes) + "-byte window were left");
    return;
  }
  ch.received += bytes.size();
  switch (ch.state) {
    case ChannelState::kConnecting:  // never reset the worker because the store is not up yet
      ch.waiting += bytes;
      break;
    case ChannelState::kOpen: {
      ch.unwritten += bytes.size();
      TunnelAction write = act(Kind::kWriteLocal, id);
      write.bytes = bytes;
      out.push_back(std::move(write));
      break;
    }
    case ChannelState::kLocalClosed:  // our socket is gone: dropped (our `close` is coming)
    case ChannelState::kPeerClosed:
      break;
  }
}

void TunnelState::on_credit(int id, Channel& ch, int credit, Actions& out) {
  const std::size_t outstanding = kChannelWindowBytes - ch.send_credit;
  if (credit < 1 || static_cast<std::size_t>(credit) > outstanding) {
    out = violation("credited " + std::to_string(credit) + " bytes back for " + channel_words(id) + ", but " +
                    std::to_string(outstanding) + " were sent and not yet credited");
    return;
  }
  ch.send_credit += static_cast<std::size_t>(credit);
  send_unsent(id, ch, out);
}

void TunnelState::on_close(int id, Channel& ch, Actions& out) {
  switch (ch.state) {
    case ChannelState::kConnecting:
      // A worker may write and close at once: what it wrote still reaches the store once it is up
      // (it was dropped: an audit, 2026-12-07). With nothing written there is nothing to deliver.
      if (!ch.waiting.empty()) {
        ch.closed_while_connecting = true;
        break;
      }
      out.push_back(act(Kind::kCloseLocal, id));
      forget(id, out);
      break;
    case ChannelState::kOpen:
      if (ch.unwritten == 0) {
        out.push_back(act(Kind::kCloseLocal, id));
        forget(id, out);
      } else {  // the peer's last bytes are written first; what we read from now on goes nowhere
        ch.state = ChannelState::kPeerClosed;
        ch.unsent.clear();
      }
      break;
    case ChannelState::kLocalClosed:  // both ends closed: what we still had for the peer has no reader
      forget(id, out);
      break;
    case ChannelState::kPeerClosed:
      break;  // on_peer refused it
  }
}

void TunnelState::send_unsent(int id, Channel& ch, Actions& out) {
  while (!ch.unsent.empty() && ch.send_credit > 0) {
    const std::size_t n = std::min({ch.unsent.size(), ch.send_credit, kMaxTunnelChunkBytes});
    out.push_back(send(NodeMessage::make_data(id, ch.unsent.substr(0, n))));
    ch.unsent.erase(0, n);
    ch.send_credit -= n;
  }
  if (ch.state == ChannelState::kLocalClosed) {
    if (ch.unsent.empty()) {
      out.push_back(send(NodeMessage::make_close(id)));
      forget(id, out);
    }
    return;
  }
  const bool blocked = ch.send_credit == 0 || !ch.unsent.empty();
  if (blocked != ch.paused) {
    ch.paused = blocked;
    out.push_back(act(blocked ? Kind::kPauseReading : Kind::kResumeReading, id));
  }
}

void TunnelState::forget(int id, Actions& out) {
  channels_.erase(id);
  if (stopped_accepting_ && channels_.size() < max_channels_) {
    stopped_accepting_ = false;
    out.push_back(act(Kind::kResumeAccepting));
  }
}

void TunnelState::close_all(bool tell_peer, Actions& out) {
  for (const auto& [id, ch] : channels_) {
    if (ch.state != ChannelState::kLocalClosed) out.push_back(act(Kind::kCloseLocal, id));
    if (tell_peer && ch.state != ChannelState::kPeerClosed) out.push_back(send(NodeMessage::make_close(id)));
  }
  channels_.clear();
  if (tell_peer && stopped_accepting_) {
    stopped_accepting_ = false;
    out.push_back(act(Kind::kResumeAccepting));
  }
}

std::vector<TunnelAction> TunnelState::violation(std::string why) {
  TunnelAction v = act(Kind::kViolation);
  v.why = std::move(why);
  Actions out{std::move(v)};
  close_all(/*tell_peer=*/false, out);
  link_closed_ = true;
  return out;
}

std::vector<TunnelAction> TunnelState::on_link_lost() {
  Actions out;
  if (link_closed_) return out;
  close_all(/*tell_peer=*/false, out);
  link_closed_ = true;
  return out;
}

}  // namespace cpprun::launcher
