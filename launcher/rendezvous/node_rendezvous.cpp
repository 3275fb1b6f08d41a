// Helpers shared by the sides of the rendezvous.
#include "rendezvous/node_rendezvous.h"

#include <poll.h>

#include <cerrno>
#include <cstring>

namespace cpprun::launcher {

const char* backend_name(RendezvousBackend backend) {
  return backend == RendezvousBackend::kC10d ? "c10d" : "static";
}

std::string RendezvousSettings::endpoint() const { return endpoint_text(host, port); }

std::string RendezvousSettings::nnodes_flag() const {
  if (fixed_ranks()) return "--nnodes=" + std::to_string(max_nodes);
  return "--nnodes=" + std::to_string(min_nodes) + ":" + std::to_string(max_nodes);
}

int take_ending_signal(SignalRelay& relay) {
  int ending = 0;
  for (int sig : relay.take_pending()) {
    if (ends_job(sig) && ending == 0) ending = sig;
  }
  return ending;
}

int poll_links(SignalRelay& relay, const std::vector<int>& fds, int timeout_ms,
               const std::function<void(int)>& on_readable) {
  std::vector<pollfd> polled{{relay.wake_fd(), POLLIN, 0}};
  for (int fd : fds) polled.push_back({fd, POLLIN, 0});
  if (poll(polled.data(), polled.size(), timeout_ms) < 0) {
    if (errno == EINTR) return 0;
    throw std::runtime_error(std::string("cpprun: poll() failed: ") + std::strerror(errno));
  }
  if (polled[0].revents != 0) {
    if (const int signal = take_ending_signal(relay); signal != 0) return signal;
  }
  for (std::size_t i = 1; i < polled.size(); ++i) {
    if (polled[i].revents != 0) on_readable(polled[i].fd);
  }
  return 0;
}

std::string describe_agent(int node_rank, const std::string& peer) {
  return "the agent of node " + std::to_string(node_rank) + (peer.empty() ? "" : " (" + peer + ")");
}

std::string rank_range(int base_rank, int local_world_size) {
  if (local_world_size == 1) return "rank " + std::to_string(base_rank);
  return "ranks " + std::to_string(base_rank) + "-" + std::to_string(base_rank + local_world_size - 1);
}

std::string seconds_text(std::chrono::milliseconds ms) {
  const long long whole = ms.count() / 1000;
  const long long millis = ms.count() % 1000;
  std::string text = std::to_string(whole);
  if (millis != 0) {
    std::string fraction = std::to_string(millis + 1000).substr(1);
    while (fraction.back() == '0') fraction.pop_back();
    text += "." + fraction;
  }
  return text + " s";
}

}  // namespace cpprun::launcher
