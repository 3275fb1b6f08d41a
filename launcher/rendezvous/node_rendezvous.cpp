// Helpers shared by the sides of the rendezvous.
#include "rendezvous/node_rendezvous.h"

#include <poll.h>

#include <algorithm>
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

std::string join_timeout_message(const RendezvousSettings& settings, const std::vector<int>& never,
                                 const std::vector<int>& left, int joined, const std::string& source) {
  const std::string at = settings.endpoint();
  std::string message = "cpprun: rendezvous timed out after " + seconds_text(settings.join_timeout) +
                        " (--rdzv_conf join_timeout): ";
  if (!settings.fixed_ranks()) {
    return message + std::to_string(joined) + " of the at least " + std::to_string(settings.min_nodes) +
           " nodes that " + settings.nnodes_flag() + " needs joined at " + at + source +
           ". Start cpprun on more nodes with the same --rdzv_endpoint, --rdzv_id and --nnodes, or raise "
           "--rdzv_conf join_timeout=SECONDS.";
  }
  const auto ranks = [](const std::vector<int>& r) {
    return std::string(r.size() == 1 ? "node rank " : "node ranks ") + join_ranks(r);
  };
  if (!never.empty()) message += ranks(never) + " of " + settings.nnodes_flag() + " never arrived at " + at;
  if (!left.empty()) {
    message += std::string(never.empty() ? "" : "; ") + ranks(left) + " joined at " + at +
               " but left again before the others came";
  }
  return message + source + ". Start cpprun on " + (never.size() + left.size() == 1 ? "that node" : "those nodes") +
         " with --node_rank set and the same --nnodes, --master_addr and --master_port, or raise "
         "--rdzv_conf join_timeout=SECONDS.";
}

int ms_until(std::chrono::steady_clock::time_point when) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(when - std::chrono::steady_clock::now());
  return static_cast<int>(std::clamp<long long>(left.count(), 0, 1 << 30));
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
