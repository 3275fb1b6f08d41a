// getaddrinfo() once at start-up, retried for a few seconds only while the resolver cannot answer.
#include "rendezvous/meeting_host.h"

#include <netdb.h>
#include <sys/socket.h>

#include <chrono>
#include <ctime>

#include "command_line/launch_config.h"
#include "rendezvous/node_rendezvous.h"

namespace cpprun::launcher {
namespace {

// How long a resolver that cannot answer (EAI_AGAIN) is given before the job fails.
constexpr std::chrono::seconds kTemporaryFailureWindow{5};
constexpr std::chrono::milliseconds kRetryPause{500};

std::string flag_text(const RendezvousSettings& settings) {
  if (!settings.fixed_ranks()) return "the host of --rdzv_endpoint=" + settings.endpoint();
  return "--master_addr=" + settings.host;
}

std::string advice(const RendezvousSettings& settings) {
  const std::string fix = ": check its spelling, /etc/hosts and DNS, or give the IP address.";
  if (!settings.fixed_ranks()) {
    return ". It must name the machine hosting the rendezvous, resolvable on every node" + fix;
  }
  if (settings.multi_node()) return ". It must be node 0's host name or IP address, resolvable on every node" + fix;
  return ". It must be an address of this machine, where worker rank 0 hosts the store (127.0.0.1 by default)" + fix;
}

}  // namespace

HostLookup look_up_host(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* list = nullptr;
  const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &list);
  if (list != nullptr) freeaddrinfo(list);
  HostLookup lookup;
  if (rc == 0) return lookup;
  lookup.error = gai_strerror(rc);
  lookup.result = rc == EAI_AGAIN ? HostLookup::Result::kTemporary : HostLookup::Result::kUnknown;
  return lookup;
}

void check_meeting_host_resolves(const RendezvousSettings& settings,
                                 const std::function<HostLookup(const std::string&)>& look_up) {
  const auto give_up = std::chrono::steady_clock::now() + kTemporaryFailureWindow;
  for (;;) {
    const HostLookup lookup = look_up(settings.host);
    switch (lookup.result) {
      case HostLookup::Result::kResolved:
        return;
      case HostLookup::Result::kUnknown:
        throw UsageError("cannot resolve " + flag_text(settings) + ": " + lookup.error + advice(settings));
      case HostLookup::Result::kTemporary:
        if (std::chrono::steady_clock::now() >= give_up) {
          throw RendezvousError("cpprun: cannot resolve " + flag_text(settings) + ": " + lookup.error +
                                    " (the resolver gave no answer for " +
                                    std::to_string(kTemporaryFailureWindow.count()) + " s)" + advice(settings),
                                1);
        }
        // Before the signal relay exists: Ctrl-C simply ends cpprun, with nothing started yet.
        const timespec pause{0, static_cast<long>(kRetryPause.count()) * 1000 * 1000};
        nanosleep(&pause, nullptr);
        break;
    }
  }
}

}  // namespace cpprun::launcher
