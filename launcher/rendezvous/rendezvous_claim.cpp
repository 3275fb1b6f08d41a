// Which side of the rendezvous this agent takes. static: node 0 hosts; the others find its links
// through its store. c10d: the first agent that can listen at --rdzv_endpoint hosts. torchrun asks
// whether the endpoint names this machine and then tries to start the store there, falling back to
// joining it; listening is the same test made atomic, so several agents on one host (the tests, or
// a single-node elastic job) agree on one host without a race. --rdzv_conf is_host=0/1 overrides it.
#include <poll.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <string>

#include "agent_store/agent_store.h"
#include "rendezvous/node_link.h"
#include "rendezvous/node_rendezvous.h"

namespace cpprun::launcher {
namespace {

using Clock = std::chrono::steady_clock;

// While nothing answers where the host will be (it may start last), how often to try again.
constexpr std::chrono::milliseconds kRetryInterval{100};

// One try to connect to the settings' host:port, for at most 5 s, and a pause after a failure,
// whose reason goes to `last_error`; a signal cuts both short. False once `deadline` has passed.
// Plain connects rather than c10d's own retries, so that a signal ends the wait at once.
bool try_connect(const RendezvousSettings& settings, SignalRelay& relay, Clock::time_point deadline,
                 std::optional<NodeLink>& link, std::string& last_error) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
  if (left.count() <= 0) return false;
  const auto try_for = std::min<std::chrono::milliseconds>(left, std::chrono::seconds(5));
  ConnectResult attempt = connect_link(settings.host, settings.port, try_for, relay.wake_fd(), settings.job_secret);
  if (attempt.status == ConnectStatus::kConnected) link = std::move(attempt.link);
  if (attempt.status == ConnectStatus::kFailed) {
    last_error = attempt.error;
    pollfd wake{relay.wake_fd(), POLLIN, 0};
    poll(&wake, 1, static_cast<int>(std::min(left, kRetryInterval).count()));
  }
  return true;
}

// static, node rank > 0: node 0's store tells the port of its agent's links.
int read_link_port(const RendezvousSettings& settings, Clock::time_point deadline) {
  // Node 0 publishes the port as soon as its store runs; a store without it is someone else's.
  const auto timeout = std::clamp(std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()),
                                  std::chrono::milliseconds(1000), kStoreTimeout);
  std::string value;
  try {
    AgentStore store = AgentStore::connect(settings.host, settings.port, timeout);
    value = store.get(kLinkPortKey);
  } catch (const AgentStoreError& e) {
    const std::string what = e.what();
    if (what.rfind("cpprun:", 0) == 0) throw RendezvousError(what, 1);
    throw RendezvousError("cpprun: " + settings.endpoint() + " answers, but not as node 0's cpprun agent (no " +
                              kLinkPortKey + " in its store within " + seconds_text(timeout) +
                              "): is another job using --master_port=" + std::to_string(settings.port) +
                              "?\nc10d said: " + what,
                          1);
  }
  try {
    return std::stoi(value);
  } catch (const std::exception&) {
    throw RendezvousError("cpprun: node 0's store at " + settings.endpoint() + " holds " + kLinkPortKey + "='" +
                              value + "', not a port; is node 0 running the same cpprun version?",
                          1);
  }
}

std::unique_ptr<NodeRendezvous> join_static(const RendezvousSettings& settings, SignalRelay& relay, int& signal,
                                            Clock::time_point started) {
  AgentStore::load();  // while node 0 may still be starting
  const auto deadline = started + settings.join_timeout;
  std::optional<NodeLink> store_probe;  // closed unused once node 0's store answers
  std::string last_error;
  while (!store_probe) {
    if (!try_connect(settings, relay, deadline, store_probe, last_error)) {
      throw RendezvousError(
          "cpprun: rendezvous timed out after " + seconds_text(settings.join_timeout) +
              " (--rdzv_conf join_timeout): node rank 0 never arrived: nothing answered at " + settings.endpoint() +
              (last_error.empty() ? "" : " (" + last_error + ")") +
              ". Start cpprun with --node_rank=0 on the host of --master_addr, with the same --master_port, "
              "or check that this host can reach that address.",
          1);
    }
    if (!store_probe && (signal = take_ending_signal(relay)) != 0) return nullptr;
  }
  const int link_port = read_link_port(settings, deadline);
  ConnectResult connected = connect_link(settings.host, link_port, kStoreTimeout, relay.wake_fd(), settings.job_secret);
  if (connected.status == ConnectStatus::kInterrupted && (signal = take_ending_signal(relay)) != 0) return nullptr;
  if (connected.status != ConnectStatus::kConnected) {
    throw RendezvousError("cpprun: node " + std::to_string(settings.node_rank) + " reached node 0's store at " +
                              settings.endpoint() + " but not node 0's agent on port " + std::to_string(link_port) +
                              " (" + connected.error +
                              "). cpprun's agents talk over that second port, which node 0's kernel picks; a "
                              "firewall must let the nodes reach each other on such ports, as Gloo needs too.",
                          1);
  }
  return make_rendezvous_member(settings, std::move(*connected.link), started);
}

// The first agent that can listen at the endpoint hosts (unless --rdzv_conf is_host says otherwise);
// the others connect there.
std::unique_ptr<NodeRendezvous> claim_c10d(const RendezvousSettings& settings, SignalRelay& relay, int& signal,
                                           Clock::time_point started) {
  std::string listen_note;  // why this agent does not host
  std::string last_error;
  for (;;) {
    if (settings.is_host.value_or(true)) {
      EndpointListener listen = LinkListener::at_endpoint(settings.host, settings.port, settings.job_secret);
      if (listen.status == ListenStatus::kListening) {
        return make_rendezvous_host(settings, std::move(*listen.listener), started);
      }
      if (listen.status == ListenStatus::kFailed) {
        throw RendezvousError("cpprun: cannot host the c10d rendezvous at " + settings.endpoint() + ": " +
                                  listen.error + ". Pick another --rdzv_endpoint (the same on every node).",
                              1);
      }
      const bool taken = listen.status == ListenStatus::kTaken;
      if (settings.is_host.value_or(false)) {
        throw RendezvousError(
            "cpprun: --rdzv_conf is_host=1, but this agent cannot listen at " + settings.endpoint() + ": " +
                (taken ? "another process on this machine listens there already"
                       : "that address is not one of this machine's") +
                ". Start the hosting agent on the machine --rdzv_endpoint names, on a free port.",
            1);
      }
      listen_note = taken ? "the port is taken on this machine" : "the address is not this machine's";
    }
    std::optional<NodeLink> link;
    if (!try_connect(settings, relay, started + settings.join_timeout, link, last_error)) {
      const std::string sep = listen_note.empty() || last_error.empty() ? "" : "; ";
      throw RendezvousError(
          "cpprun: rendezvous timed out after " + seconds_text(settings.join_timeout) +
              " (--rdzv_conf join_timeout): nothing answered at " + settings.endpoint() + " (--rdzv_endpoint) (" +
              listen_note + sep + last_error +
              "). Start cpprun with the same --rdzv_endpoint on the machine it names (any node there hosts the "
              "rendezvous), or check that this host can reach that address.",
          1);
    }
    if (link) return make_rendezvous_member(settings, std::move(*link), started);
    if ((signal = take_ending_signal(relay)) != 0) return nullptr;
  }
}

}  // namespace

std::unique_ptr<NodeRendezvous> open_rendezvous(const RendezvousSettings& settings, SignalRelay& relay, int& signal) {
  const auto started = Clock::now();
  if (!settings.fixed_ranks()) return claim_c10d(settings, relay, signal, started);
  if (settings.node_rank != 0) return join_static(settings, relay, signal, started);
  return make_rendezvous_host(settings, LinkListener(is_loopback_host(settings.host), settings.job_secret), started);
}

}  // namespace cpprun::launcher
