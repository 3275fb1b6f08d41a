// The connections a rendezvous host accepted whose agents have not introduced themselves yet.
// Anyone who reaches the port can open one, so they are bounded: at most kMaxPending (the oldest
// goes first), each dropped if unproven after NodeLink::kHandshakeTimeout, each read at most one
// line's worth at a time (node_link.cpp).
#pragma once

#include <cstddef>
#include <optional>
#include <utility>
#include <vector>

#include "rendezvous/node_link.h"
#include "rendezvous/node_messages.h"

namespace cpprun::launcher {

class PendingLinks {
 public:
  static constexpr std::size_t kMaxPending = 16;

  // Accepts every connection waiting at `listener`, after dropping the overdue ones.
  void accept_from(LinkListener& listener);

  std::vector<int> fds() const;
  bool owns(int fd) const;

  // Reads the link on `fd`. Once it has proven the secret and sent its first message, hands both
  // over; a link that closed or was refused (warned about, naming only its address) is dropped.
  std::optional<std::pair<NodeLink, NodeMessage>> read(int fd);

 private:
  std::vector<NodeLink> links_;
};

}  // namespace cpprun::launcher
