// Opening the rendezvous, and what its two sides share. The meeting host's name is resolved once at
// start-up, retried for a few seconds only while the resolver cannot answer. Then this agent claims
// its side. static: node 0 hosts. c10d: the first agent that can listen at --rdzv_endpoint hosts;
// torchrun asks whether the endpoint names this machine, then tries to host there, and listening is
// that test made atomic, so that several agents on one host (the tests, a single-node elastic job)
// agree on one host without a race. --rdzv_conf is_host=0/1 overrides it.
#include "rendezvous/node_rendezvous.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string_view>
#include <system_error>
#include <thread>

#include "command_line/launch_config.h"
#include "common/formatting.h"
#include "workers/console_sink.h"

namespace cpprun::launcher {
namespace {

// How long a resolver that cannot answer (EAI_AGAIN) is given before the job fails.
constexpr std::chrono::seconds kTemporaryFailureWindow{5};
constexpr std::chrono::milliseconds kRetryPause{500};

std::string flag_text(const RendezvousSettings& settings) {
  if (!settings.host_flag.empty()) return settings.host_flag;
  if (!settings.fixed_ranks()) return "the host of --rdzv_endpoint=" + settings.endpoint();
  return "--master_addr=" + settings.host;
}

std::string advice(const RendezvousSettings& settings) {
  const std::string fix = ": check its spelling, /etc/hosts and DNS, or give the IP address.";
  if (!settings.fixed_ranks()) {
    return ". It must name the machine hosting the rendezvous, resolvable on every node" + fix;
  }
  if (settings.multi_node()) return ". It must be node 0's host name or IP address, resolvable on every node" + fix;
  return ". It must be an address of this machine, the job's only host (127.0.0.1 by default)" + fix;
}

// The job-ending signal among the pending ones, or 0; no worker runs now, so the others are dropped.
int take_ending_signal(SignalRelay& relay) {
  const std::vector<int> pending = relay.take_pending();
  const auto ending = std::find_if(pending.begin(), pending.end(), ends_job);
  return ending == pending.end() ? 0 : *ending;
}

// One try to connect to the settings' host:port, for at most 5 s, and a pause after a failure,
// whose reason goes to `last_error` (`refusals` counts them: it sets the pause); a signal cuts both
// short. False once `deadline` has passed.
// Plain connects rather than c10d's own retries, so that a signal ends the wait at once.
bool try_connect(const RendezvousSettings& settings, SignalRelay& relay, Clock::time_point deadline,
                 std::optional<NodeLink>& link, std::string& last_error, int& refusals) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
  if (left.count() <= 0) return false;
  const auto try_for = std::min<std::chrono::milliseconds>(left, std::chrono::seconds(5));
  ConnectResult attempt = connect_link(settings.host, settings.port, try_for, relay.wake_fd(), settings.job_secret);
  if (attempt.status == ConnectStatus::kConnected) link = std::move(attempt.link);
  if (attempt.status == ConnectStatus::kFailed) {
    last_error = attempt.error;
    pollfd wake{relay.wake_fd(), POLLIN, 0};
    poll(&wake, 1, static_cast<int>(std::min(left, retry_pause(refusals++)).count()));
  }
  return true;
}

// A new link to the host at settings.host:port, for a member whose first one was dropped unproven.
Reconnect reconnect_to(const RendezvousSettings& settings, int port, SignalRelay& relay) {
  return [host = settings.host, port, secret = settings.job_secret, &relay](Clock::time_point deadline,
                                                                            std::string& error) {
    const auto left = std::clamp(std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()),
                                 std::chrono::milliseconds(1), std::chrono::milliseconds(5000));
    ConnectResult connected = connect_link(host, port, left, relay.wake_fd(), secret);
    if (connected.status != ConnectStatus::kConnected) error = connected.error;
    return std::move(connected.link);
  };
}

// static, node rank > 0: connects to node 0's agent at --master_port, retrying while nothing answers
// there (node 0 may start last) until the join timeout.
std::unique_ptr<NodeRendezvous> join_static(const RendezvousSettings& settings, SignalRelay& relay, int& signal,
                                            Clock::time_point started) {
  const auto deadline = started + settings.join_timeout;
  std::optional<NodeLink> link;
  std::string last_error;
  int refusals = 0;
  while (!link) {
    if (!try_connect(settings, relay, deadline, link, last_error, refusals)) {
      throw RendezvousError(
          "cpprun: rendezvous timed out after " + seconds_text(settings.join_timeout) +
              " (--rdzv_conf timeout): node rank 0 never arrived: nothing answered at " + settings.endpoint() +
              (last_error.empty() ? "" : " (" + last_error + ")") +
              ". Start cpprun with --node_rank=0 on the host of --master_addr, with the same --master_port, "
              "or check that this host can reach that address.",
          1);
    }
    if (!link && (signal = take_ending_signal(relay)) != 0) return nullptr;
  }
  return make_rendezvous_member(settings, std::move(*link), started, reconnect_to(settings, settings.port, relay));
}

// static, node 0: listens for the other agents at --master_port, where torchrun's node 0 hosts its store.
std::unique_ptr<NodeRendezvous> host_static(const RendezvousSettings& settings, const KeeperSettings& keeper,
                                            Clock::time_point started) {
  try {
    return make_rendezvous_host(
        settings, keeper, LinkListener(loopback_listen_address(settings.host), settings.port, settings.job_secret), started);
  } catch (const std::system_error& e) {
    if (e.code().value() == EADDRINUSE) {
      throw RendezvousError("cpprun: node 0 cannot host the rendezvous: --master_port=" +
                                std::to_string(settings.port) +
                                " is already in use on this host (another job, or one still shutting down). Pick a "
                                "free port with --master_port=PORT on every node.",
                            1);
    }
    throw RendezvousError("cpprun: node 0 cannot listen for the other nodes on --master_port=" +
                              std::to_string(settings.port) + ": " + e.code().message(),
                          1);
  }
}

// The first agent that can listen at the endpoint hosts (unless --rdzv_conf is_host); the others connect.
std::unique_ptr<NodeRendezvous> claim_c10d(const RendezvousSettings& settings, const KeeperSettings& keeper,
                                           SignalRelay& relay, int& signal, Clock::time_point started) {
  std::string listen_note;  // why this agent does not host
  std::string last_error;
  int refusals = 0;
  for (;;) {
    if (settings.is_host.value_or(true)) {
      EndpointListener listen = LinkListener::at_endpoint(settings.host, settings.port, settings.job_secret);
      if (listen.status == ListenStatus::kListening) {
        return make_rendezvous_host(settings, keeper, std::move(*listen.listener), started);
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
    if (!try_connect(settings, relay, started + settings.join_timeout, link, last_error, refusals)) {
      const std::string sep = listen_note.empty() || last_error.empty() ? "" : "; ";
      throw RendezvousError(
          "cpprun: rendezvous timed out after " + seconds_text(settings.join_timeout) +
              " (--rdzv_conf join_timeout): nothing answered at " + settings.endpoint() + " (--rdzv_endpoint) (" +
              listen_note + sep + last_error +
              "). Start cpprun with the same --rdzv_endpoint on the machine it names (any node there hosts the "
              "rendezvous), or check that this host can reach that address.",
          1);
    }
    if (link) {
      return make_rendezvous_member(settings, std::move(*link), started, reconnect_to(settings, settings.port, relay));
    }
    if ((signal = take_ending_signal(relay)) != 0) return nullptr;
  }
}

}  // namespace

int NodeRendezvous::poll_links(SignalRelay& relay, int timeout_ms) {
  std::vector<pollfd> polled{{relay.wake_fd(), POLLIN, 0}};
  ConsoleWait consoles;  // Note [The launcher's own lines] in console_sink.h
  const std::size_t first_link = 1 + consoles.add(polled);
  for (const pollfd& fd : poll_fds()) polled.push_back(fd);
  if (poll(polled.data(), polled.size(), poll_timeout(polled, timeout_ms)) < 0) {
    if (errno == EINTR) return 0;
    throw std::runtime_error(std::string("cpprun: poll() failed: ") + std::strerror(errno));
  }
  consoles.after(polled);
  if (polled[0].revents != 0) {
    if (const int signal = take_ending_signal(relay); signal != 0) return signal;
  }
  dispatch(polled, first_link);
  return 0;
}

std::string join_timeout_message(const RendezvousSettings& settings, const std::vector<int>& never,
                                 const std::vector<int>& left, int joined, const std::string& source) {
  const std::string at = settings.endpoint();
  std::string message = "cpprun: rendezvous timed out after " + seconds_text(settings.join_timeout) +
                        " (--rdzv_conf " + settings.join_timeout_key() + "): ";
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
         "--rdzv_conf timeout=SECONDS.";
}

std::chrono::milliseconds retry_pause(int tries) {
  return std::chrono::milliseconds(std::min(100, 5 << std::clamp(tries, 0, 5)));
}

RendezvousError job_end_error(const JobEnd& end) {
  constexpr std::string_view kPrefix = "cpprun: ";
  const bool prefixed = end.reason.compare(0, kPrefix.size(), kPrefix) == 0;
  return RendezvousError(prefixed ? end.reason : std::string(kPrefix) + end.reason, end.exit_code);
}

int ms_until(Clock::time_point when) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(when - Clock::now());
  return static_cast<int>(std::clamp<long long>(left.count(), 0, 1 << 30));
}

std::string describe_agent(int node_rank, const std::string& peer) {
  return "the agent of node " + std::to_string(node_rank) + (peer.empty() ? "" : " (" + peer + ")");
}

std::string rank_range(int base_rank, int local_world_size) {
  if (local_world_size == 1) return "rank " + std::to_string(base_rank);
  return "ranks " + std::to_string(base_rank) + "-" + std::to_string(base_rank + local_world_size - 1);
}

std::string seconds_text(std::chrono::milliseconds ms) { return decimal_seconds(ms) + " s"; }

HostLookup look_up_host(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* list = nullptr;
  const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &list);
  if (list != nullptr) freeaddrinfo(list);
  if (rc == 0) return {};
  return {rc == EAI_AGAIN ? HostLookup::Result::kTemporary : HostLookup::Result::kUnknown, gai_strerror(rc)};
}

void check_meeting_host_resolves(const RendezvousSettings& settings,
                                 const std::function<HostLookup(const std::string&)>& look_up) {
  const auto give_up = Clock::now() + kTemporaryFailureWindow;
  for (;;) {
    const HostLookup lookup = look_up(settings.host);
    if (lookup.result == HostLookup::Result::kResolved) return;
    const std::string failed = "cannot resolve " + flag_text(settings) + ": " + lookup.error;
    if (lookup.result == HostLookup::Result::kUnknown) throw UsageError(failed + advice(settings));
    if (Clock::now() >= give_up) {
      throw RendezvousError("cpprun: " + failed + " (the resolver gave no answer for " +
                                seconds_text(kTemporaryFailureWindow) + ")" + advice(settings),
                            1);
    }
    // Before the signal relay exists: Ctrl-C simply ends cpprun, with nothing started yet.
    std::this_thread::sleep_for(kRetryPause);
  }
}

std::unique_ptr<NodeRendezvous> open_rendezvous(const RendezvousSettings& settings, const KeeperSettings& keeper,
                                                SignalRelay& relay, int& signal) {
  const auto started = Clock::now();
  if (!settings.fixed_ranks()) return claim_c10d(settings, keeper, relay, signal, started);
  if (settings.node_rank != 0) return join_static(settings, relay, signal, started);
  return host_static(settings, keeper, started);
}

}  // namespace cpprun::launcher
