// cpprun_link_probe: a hostile node that holds the job secret (tests/launcher/behaviour/tunnel_hostile.sh).
// It joins a static two-node job's rendezvous as node 1, with the launcher's own NodeLink (so the
// HMAC and the framing are the agents', not a second implementation), and once round R has started
// sends one sequence of store-tunnel messages that breaks a rule of Note [Store tunnel flow control].
// Then it waits for the host to close the link, and reports the host agent's memory: VmRSS before
// the sequence, VmHWM (the peak) right after the link closed.
//
//   CPPRUN_JOB_SECRET=... cpprun_link_probe SEQUENCE HOST PORT RUN_ID HOST_PID
//
// With CPPRUN_PROBE_SEND_AFTER=FILE it sends the sequence only once FILE exists (the round started
// first): a test's stand-in store keeper creates it once it is in the state the sequence needs.
//
// Exit: 0 the host closed the link within kWaitForClose; 1 it kept it open (or the host's memory
// could not be read); 2 bad arguments or no round started.
#include <poll.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <string>

#include "rendezvous/node_link.h"
#include "rendezvous/node_messages.h"
#include "rendezvous/store_tunnel.h"

namespace {

using namespace cpprun::launcher;

constexpr std::chrono::seconds kJoinTimeout{20};
constexpr std::chrono::seconds kWaitForClose{10};

// Each sequence: what it sends, once round `round` has started.
using Sequence = std::function<void(NodeLink&, int round)>;

void open(NodeLink& link, int round, int channel) { link.send(NodeMessage::make_open(round, channel)); }
void data(NodeLink& link, int channel, std::size_t n) {
  link.send(NodeMessage::make_data(channel, std::string(n, 'x')));
}

const std::map<std::string, std::pair<std::string, Sequence>>& sequences() {
  static const std::map<std::string, std::pair<std::string, Sequence>> all = {
      {"over_credit",
       {"open channel 1, fill its 128 KiB window (48+48+32 KiB), then 1 byte more",
        [](NodeLink& l, int r) {
          open(l, r, 1);
          data(l, 1, kMaxTunnelChunkBytes);
          data(l, 1, kMaxTunnelChunkBytes);
          data(l, 1, kChannelWindowBytes - 2 * kMaxTunnelChunkBytes);
          data(l, 1, 1);
        }}},
      {"data_unopened", {"data for channel 7, never opened", [](NodeLink& l, int) { data(l, 7, 16); }}},
      {"credit_unopened",
       {"credit for channel 7, never opened", [](NodeLink& l, int) { l.send(NodeMessage::make_credit(7, 4096)); }}},
      {"close_unopened",
       {"close for channel 7, never opened", [](NodeLink& l, int) { l.send(NodeMessage::make_close(7)); }}},
      {"credit_unsent",
       {"open channel 1, then credit 4096 bytes the host never sent",
        [](NodeLink& l, int r) {
          open(l, r, 1);
          l.send(NodeMessage::make_credit(1, 4096));
        }}},
      {"open_skipped", {"open channel 2 first", [](NodeLink& l, int r) { open(l, r, 2); }}},
      {"open_reused",
       {"open channel 1 twice",
        [](NodeLink& l, int r) {
          open(l, r, 1);
          open(l, r, 1);
        }}},
      {"open_past_cap",
       {"open channels 1 to 300 (the cap is 256)",
        [](NodeLink& l, int r) {
          for (int ch = 1; ch <= 300; ++ch) open(l, r, ch);
        }}},
      {"chunk_too_big",
       {"open channel 1, then one data message of 48 KiB + 1 byte",
        [](NodeLink& l, int r) {
          open(l, r, 1);
          data(l, 1, kMaxTunnelChunkBytes + 1);
        }}},
      {"bad_base64",
       {"open channel 1, then data whose bytes are not base64 ('TWF')",
        [](NodeLink& l, int r) {
          open(l, r, 1);
          l.send_line("data 1 TWF");
        }}},
  };
  return all;
}

// A field of /proc/PID/status in KiB ("VmRSS", "VmHWM"), or -1 when the process is gone.
long status_kib(int pid, const std::string& field) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.compare(0, field.size() + 1, field + ":") == 0) return std::atol(line.c_str() + field.size() + 1);
  }
  return -1;
}

// Polls the link (reading and, while its queue holds lines, writing) for at most `ms`.
NodeLink::Received pump(NodeLink& link, int ms) {
  pollfd entry = link.poll_entry();
  if (poll(&entry, 1, ms) > 0 && (entry.revents & POLLOUT)) link.flush();
  if (entry.revents & (POLLIN | POLLHUP | POLLERR)) return link.receive();
  return {};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 6 || sequences().count(argv[1]) == 0) {
    std::cerr << "usage: CPPRUN_JOB_SECRET=... cpprun_link_probe SEQUENCE HOST PORT RUN_ID HOST_PID\nsequences:";
    for (const auto& [name, what] : sequences()) std::cerr << "\n  " << name << ": " << what.first;
    std::cerr << "\n";
    return 2;
  }
  const std::string name = argv[1];
  const char* secret = std::getenv("CPPRUN_JOB_SECRET");
  const int host_pid = std::atoi(argv[5]);
  ConnectResult connected = connect_link(argv[2], std::atoi(argv[3]), kJoinTimeout, -1, secret ? secret : "");
  if (!connected.link) {
    std::cerr << "probe: cannot reach the host: " << connected.error << "\n";
    return 2;
  }
  NodeLink& link = *connected.link;
  NodeHello hello;
  hello.backend = "static";
  hello.node_rank = 1;
  hello.min_nodes = hello.max_nodes = 2;
  hello.run_id = argv[4];
  link.send(NodeMessage::make_hello(hello));

  // Wait for round R's `start`, as node 1's agent would.
  int round = -1;
  for (const auto deadline = Clock::now() + kJoinTimeout; round < 0;) {
    if (Clock::now() >= deadline) {
      std::cerr << "probe: no round started within " << kJoinTimeout.count() << " s\n";
      return 2;
    }
    NodeLink::Received got = pump(link, 100);
    for (const NodeMessage& m : got.messages) {
      if (m.kind == MessageKind::kStart) round = m.round;
    }
    if (got.closed) {
      std::cerr << "probe: the host closed the link before a round started: " << got.refused << got.violation << "\n";
      return 2;
    }
  }
  if (const char* after = std::getenv("CPPRUN_PROBE_SEND_AFTER"); after != nullptr && *after != '\0') {
    for (const auto deadline = Clock::now() + kJoinTimeout; !std::ifstream(after).good();) {
      if (Clock::now() >= deadline) {
        std::cerr << "probe: " << after << " (CPPRUN_PROBE_SEND_AFTER) did not appear within " << kJoinTimeout.count()
                  << " s\n";
        return 2;
      }
      if (pump(link, 10).closed) {
        std::cerr << "probe: the host closed the link while the probe waited for " << after << "\n";
        return 2;
      }
    }
  }
  const long rss_before = status_kib(host_pid, "VmRSS");
  std::cout << "probe: joined as node 1; round " << round << " started; host VmRSS " << rss_before << " KiB"
            << std::endl;

  const auto& [what, send] = sequences().at(name);
  send(link, round);
  std::cout << "probe: sent " << name << ": " << what << std::endl;

  const auto sent_at = Clock::now();
  bool closed = false;
  while (!closed && Clock::now() < sent_at + kWaitForClose) closed = pump(link, 100).closed;
  const long peak_after = status_kib(host_pid, "VmHWM");
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - sent_at).count();
  if (!closed) {
    std::cout << "probe: the host kept the link open " << ms << " ms after " << name << std::endl;
    return 1;
  }
  std::cout << "probe: the host closed the link " << ms << " ms after " << name << std::endl;
  if (rss_before < 0 || peak_after < 0) {
    std::cout << "probe: the host's memory could not be read (pid " << host_pid << " gone)" << std::endl;
    return 1;
  }
  std::cout << "probe: host VmHWM " << peak_after << " KiB after; growth " << peak_after - rss_before << " KiB"
            << std::endl;
  return 0;
}
