// The TCP links between the agents of a multi-node job. Each member agent keeps one connection to
// node 0's agent for the whole job; the messages of node_messages.h travel on it, and its end is
// how one agent learns at once that another is gone: the kernel closes a killed process's
// sockets, and TCP keep-alive notices a host that went away (about 30 s).
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "node_messages.h"

namespace cpprun::launcher {

class NodeLink {
 public:
  // Takes a connected socket; `peer` ("10.0.0.2:41234") is for messages.
  NodeLink(int fd, std::string peer);
  ~NodeLink();
  NodeLink(NodeLink&& other) noexcept;
  NodeLink& operator=(NodeLink&& other) noexcept;
  NodeLink(const NodeLink&) = delete;
  NodeLink& operator=(const NodeLink&) = delete;

  int fd() const { return fd_; }
  const std::string& peer() const { return peer_; }

  // Sends one message. False when the connection is gone; the next receive() then reports it.
  bool send(const NodeMessage& message);

  struct Received {
    std::vector<NodeMessage> messages;  // complete messages, in order
    bool closed = false;                // the peer closed the link, or it broke
    std::string bad_line;               // set when a line was not a message (the link is then closed)
  };
  // Reads what has arrived, without blocking. Call when poll() says fd() is readable.
  Received receive();

 private:
  void close_fd();
  int fd_ = -1;
  std::string peer_;
  std::string buffer_;  // an incomplete line
};

enum class ListenStatus;
struct EndpointListener;

// Accepts the member agents' links: on a port the kernel picks (static rendezvous), or at the
// c10d rendezvous endpoint itself.
class LinkListener {
 public:
  // On the loopback only when `loopback_only` (every node on this host), else on every interface,
  // as c10d's store listens. Throws std::system_error.
  explicit LinkListener(bool loopback_only);
  // Listens at host:port, on the first of the host's addresses that is this machine's. Only one
  // process can: the others learn that it is taken (kTaken) and that agent hosts the rendezvous.
  static EndpointListener at_endpoint(const std::string& host, int port);
  ~LinkListener();
  LinkListener(LinkListener&& other) noexcept;
  LinkListener& operator=(LinkListener&& other) noexcept;
  LinkListener(const LinkListener&) = delete;
  LinkListener& operator=(const LinkListener&) = delete;

  int fd() const { return fd_; }
  int port() const { return port_; }
  // A connection waiting to be accepted, if any; never blocks.
  std::optional<NodeLink> accept();

 private:
  LinkListener(int fd, int port) : fd_(fd), port_(port) {}
  int fd_ = -1;
  int port_ = 0;
};

enum class ListenStatus {
  kListening,  // this process now listens there
  kTaken,      // another process listens there (on this machine)
  kNotHere,    // no address of the host is this machine's
  kFailed,     // cannot resolve, or another error (`error` says which)
};

struct EndpointListener {
  ListenStatus status = ListenStatus::kFailed;
  std::optional<LinkListener> listener;  // kListening
  std::string error;
};

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

// One attempt to connect to host:port, trying each address the host resolves to, for at most
// `timeout` in all; gives up early when `wake_fd` becomes readable (-1: never).
ConnectResult connect_link(const std::string& host, int port, std::chrono::milliseconds timeout, int wake_fd);

// Every address `host` resolves to is a loopback one (127.0.0.0/8, ::1): the job is on this host.
bool is_loopback_host(const std::string& host);

}  // namespace cpprun::launcher
