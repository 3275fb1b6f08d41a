// Who hosts a c10d rendezvous: the first agent that can listen at --rdzv_endpoint. torchrun asks
// whether the endpoint names this machine and then tries to start the store there, falling back to
// joining it; listening is the same test made atomic, so several agents on one host (the tests, or
// a single-node elastic job) agree on one host without a race. --rdzv_conf is_host=0/1 overrides it.
#include <poll.h>

#include <algorithm>
#include <chrono>
#include <iostream>

#include "node_link.h"
#include "node_rendezvous.h"

namespace cpprun::launcher {
namespace {

using Clock = std::chrono::steady_clock;

// While nothing answers at the endpoint (its host may start last), how often to try again.
constexpr std::chrono::milliseconds kRetryInterval{100};

std::string timeout_message(const LaunchConfig& config, const std::string& why) {
  return "cpprun: rendezvous timed out after " + seconds_text(config.join_timeout) +
         " (--rdzv_conf join_timeout): nothing answered at " + endpoint_text(config) + " (--rdzv_endpoint) (" + why +
         "). Start cpprun with the same --rdzv_endpoint on the machine it names (any node there hosts the "
         "rendezvous), or check that this host can reach that address.";
}

}  // namespace

std::unique_ptr<NodeRendezvous> claim_elastic_rendezvous(const LaunchConfig& config, SignalRelay& relay,
                                                         int& signal) {
  const auto started = Clock::now();
  const auto deadline = started + config.join_timeout;
  std::string listen_note;  // why this agent does not host
  std::string last_error;
  for (;;) {
    if (config.is_host.value_or(true)) {
      EndpointListener listen = LinkListener::at_endpoint(config.master_addr, config.master_port, config.job_secret);
      if (listen.status == ListenStatus::kListening) {
        return make_elastic_host(config, std::move(*listen.listener), started);
      }
      if (listen.status == ListenStatus::kFailed) {
        throw RendezvousError("cpprun: cannot host the c10d rendezvous at " + endpoint_text(config) + ": " +
                                  listen.error + ". Pick another --rdzv_endpoint (the same on every node).",
                              1);
      }
      if (config.is_host.value_or(false)) {
        throw RendezvousError(
            "cpprun: --rdzv_conf is_host=1, but this agent cannot listen at " + endpoint_text(config) + ": " +
                (listen.status == ListenStatus::kTaken ? "another process on this machine listens there already"
                                                       : "that address is not one of this machine's") +
                ". Start the hosting agent on the machine --rdzv_endpoint names, on a free port.",
            1);
      }
      listen_note = listen.status == ListenStatus::kTaken ? "the port is taken on this machine"
                                                          : "the address is not this machine's";
    }
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      const std::string sep = listen_note.empty() || last_error.empty() ? "" : "; ";
      throw RendezvousError(timeout_message(config, listen_note + sep + last_error), 1);
    }
    ConnectResult connected = connect_link(config.master_addr, config.master_port,
                                           std::min<std::chrono::milliseconds>(left, std::chrono::seconds(5)),
                                           relay.wake_fd(), config.job_secret);
    if (connected.status == ConnectStatus::kConnected) {
      return make_elastic_member(config, std::move(*connected.link), started);
    }
    if (connected.status == ConnectStatus::kFailed) {
      last_error = connected.error;
      pollfd wake{relay.wake_fd(), POLLIN, 0};
      poll(&wake, 1, static_cast<int>(std::min(left, kRetryInterval).count()));
    }
    if ((signal = take_ending_signal(relay)) != 0) return nullptr;
  }
}

}  // namespace cpprun::launcher
