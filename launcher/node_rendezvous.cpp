// Helpers shared by the sides of both rendezvous.
#include "node_rendezvous.h"

namespace cpprun::launcher {

int take_ending_signal(SignalRelay& relay) {
  int ending = 0;
  for (int sig : relay.take_pending()) {
    if (ends_job(sig) && ending == 0) ending = sig;
  }
  return ending;
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
