// Bounded bookkeeping of accepted, not yet introduced links; see pending_links.h.
#include "rendezvous/pending_links.h"

#include <algorithm>
#include <chrono>

namespace cpprun::launcher {

void PendingLinks::accept_from(LinkListener& listener) {
  const auto now = std::chrono::steady_clock::now();
  links_.erase(std::remove_if(links_.begin(), links_.end(),
                              [now](const NodeLink& link) { return link.handshake_overdue(now); }),
               links_.end());
  while (std::optional<NodeLink> link = listener.accept()) {
    if (links_.size() >= kMaxPending) links_.erase(links_.begin());
    links_.push_back(std::move(*link));
  }
}

std::vector<int> PendingLinks::fds() const {
  std::vector<int> fds;
  for (const NodeLink& link : links_) fds.push_back(link.fd());
  return fds;
}

bool PendingLinks::owns(int fd) const {
  return std::any_of(links_.begin(), links_.end(), [fd](const NodeLink& link) { return link.fd() == fd; });
}

std::optional<std::pair<NodeLink, NodeMessage>> PendingLinks::read(int fd) {
  const auto it = std::find_if(links_.begin(), links_.end(), [fd](const NodeLink& link) { return link.fd() == fd; });
  if (it == links_.end()) return std::nullopt;
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

}  // namespace cpprun::launcher
