// What the agents of a multi-node job say to each other over their links (node_link.h): one
// message per line, words separated by spaces, each word escaped. Pure, so unit-tested.
//
// The agent hosting the rendezvous (the host) and each other agent (a member) say:
//   member -> host   hello     who I am: backend, node rank, nnodes, nproc, max_restarts, run id, role
//   host -> member   gathering round N has this many nodes so far, and (static) the node ranks
//                              still missing (after every arrival or departure)
//   host -> member   queued    c10d: round N runs without you; you are in the next one
//   host -> member   start     round N begins: your ranks, the workers' MASTER_PORT, and whether their
//                              store is reached through the link (store_tunnel_io.h)
//   member -> host   done      my workers of round N all succeeded
//   member -> host   failed    round N failed here (a worker, or a signal to this agent)
//   host -> member   end       round N is over (failed somewhere): stop your workers
//   member -> host   stopped   my workers of round N are stopped
//   host -> member   exit      the job is over: exit with this code (0 when every node was done)
//   host -> member   ask       cpprun --diagnose on the host: request R of round N, send your ranks' evidence
//   member -> host   evidence  one of my ranks' flight-recorder dump and fate, one message per rank: round N
//                              failed somewhere (request 0, Note [One diagnosis for several nodes]), or my
//                              answer to `ask` R (Note [Diagnosis on request across nodes])
//   member -> host   open      a worker of round N connected to the store: channel CH carries it (store_tunnel.h)
//   both             data      bytes of channel CH (base64 on the wire), within the channel's credit
//   both             credit    N bytes of channel CH were written to this side's socket: send N more
//   both             close     channel CH's socket on this side closed
// A restart is a new `start` with the next round number; see Note [Elastic rounds].
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "common/formatting.h"  // printable(): a peer's words are printed
#include "diagnosis/hang_diagnosis.h"
#include "workers/rank_layout.h"

namespace cpprun::launcher {

// Bumped when a message changes; agents of different versions refuse each other at `hello`.
// 9: an evidence entry's tag and label; 8: the store tunnel's kinds; 7: kAsk, kEvidence's request.
inline constexpr int kNodeProtocolVersion = 9;

// Note [Bounding a peer's evidence]
// An evidence message carries one rank's flight-recorder entries. The library keeps 2,000 by default
// (CPPRUN_FLIGHT_RECORDER_ENTRIES, as PyTorch's TORCH_FR_BUFFER_SIZE) and at most 1,000,000; the wire
// takes the newest kMaxEvidenceEntries, each a dozen words of typically 60-120 bytes (a send or receive
// with its label up to about 300: labels are cut to kMaxLabelBytes on both sides), so that one
// message is bounded by kMaxEvidenceEntries * kEvidenceEntryBytes plus the words about the rank. A
// sender drops its oldest entries until its message fits; a receiver refuses a longer line (NodeLink)
// or more entries (decode_message) as not our protocol. The diagnosis needs the newest entries only:
// where each rank is, and the first disagreement among what the ranks still hold.
inline constexpr std::size_t kMaxEvidenceEntries = 2000;
inline constexpr std::size_t kEvidenceEntryBytes = 256;
inline constexpr std::size_t kMaxEvidenceBytes = kMaxEvidenceEntries * kEvidenceEntryBytes + 8 * 1024;

// The most bytes one `data` message carries: its base64 is 64 KiB, so a tunnel's line stays well under
// the longest line a link takes (kMaxEvidenceBytes), and one message never holds up the link for long.
inline constexpr std::size_t kMaxTunnelChunkBytes = 48 * 1024;

enum class MessageKind {
  kHello, kGathering, kQueued, kStart, kDone, kFailed, kStopped, kEnd, kExit, kEvidence, kAsk,
  kOpen, kData, kCredit, kClose,  // the store tunnel's (store_tunnel.h)
};
// open, data, credit, close: what TunnelState takes from the link. Every kind is listed, so that a
// kind added later is a compile warning (-Wswitch) here until it is put on one side.
inline bool is_tunnel_kind(MessageKind kind) {
  switch (kind) {
    case MessageKind::kOpen:
    case MessageKind::kData:
    case MessageKind::kCredit:
    case MessageKind::kClose:
      return true;
    case MessageKind::kHello:
    case MessageKind::kGathering:
    case MessageKind::kQueued:
    case MessageKind::kStart:
    case MessageKind::kDone:
    case MessageKind::kFailed:
    case MessageKind::kStopped:
    case MessageKind::kEnd:
    case MessageKind::kExit:
    case MessageKind::kEvidence:
    case MessageKind::kAsk:
      return false;
  }
  return false;
}

struct NodeHello {
  int protocol = kNodeProtocolVersion;
  std::string backend = "static";  // --rdzv_backend: agents of different backends refuse each other
  int node_rank = 0;               // static: --node_rank; c10d: -1 (the rendezvous numbers the nodes)
  int min_nodes = 1;               // --nnodes=MIN:MAX; static: both are --nnodes
  int max_nodes = 1;
  int max_restarts = 0;
  std::string run_id;
  NodeShape shape;  // --nproc_per_node and --role
};

// Why a round (or the job) ended, and the exit code it implies.
struct JobEnd {
  int exit_code = 1;
  bool restartable = false;  // a worker failed; false for signals and lost agents
  std::string reason;        // one line, e.g. "rank 2 (local_rank 0, pid 41) on node 1 exited with code 3"
};

struct NodeMessage {
  MessageKind kind = MessageKind::kHello;
  int round = 0;               // kGathering, kQueued, kStart, kDone, kFailed, kStopped, kEnd, kEvidence, kAsk
  JobEnd end{};                // kFailed, kEnd, kExit
  NodeHello hello{};           // kHello
  std::vector<int> missing{};  // kGathering: static node ranks not joined yet
  int nodes = 0;               // kGathering: nodes in the round so far; kQueued: nodes running it
  bool restarting = false;     // kQueued: the running round is being ended to take this node in
  int restart_count = 0;       // kStart: TORCHELASTIC_RESTART_COUNT
  RankLayout layout{};         // kStart: group rank and size, ranks, master_port (the store keeper's), tunnelled
  RankEvidence evidence{};     // kEvidence: one rank's dump (if any) and fate
  int request = 0;             // kAsk: the request's number (from 1); kEvidence: the one it answers, 0 for a failure
  int channel = 0;             // kOpen, kData, kCredit, kClose: the tunnel's channel (from 1)
  std::string bytes{};         // kData: 1 to kMaxTunnelChunkBytes of the channel's bytes (base64 on the wire)
  int credit = 0;              // kCredit: how many more bytes the peer may send on the channel (from 1)

  static NodeMessage make_hello(const NodeHello& hello);
  static NodeMessage make_gathering(int round, int nodes, std::vector<int> missing);
  static NodeMessage make_queued(int round, int nodes, bool restarting);
  static NodeMessage make_start(int round, int restart_count, const RankLayout& layout);
  static NodeMessage make_done(int round);
  static NodeMessage make_failed(int round, JobEnd end);
  static NodeMessage make_stopped(int round);
  static NodeMessage make_end(int round, JobEnd end);
  static NodeMessage make_exit(JobEnd end);
  // Drops the oldest entries of the dump that do not fit: Note [Bounding a peer's evidence].
  // `request`: 0 when the round failed, else the number of the `ask` it answers.
  static NodeMessage make_evidence(int round, RankEvidence evidence, int request = 0);
  static NodeMessage make_ask(int round, int request);
  static NodeMessage make_open(int round, int channel);
  static NodeMessage make_data(int channel, std::string bytes);
  static NodeMessage make_credit(int channel, int credit);
  static NodeMessage make_close(int channel);
};

// One line, without the newline.
std::string encode_message(const NodeMessage& message);
// nullopt for a line that is not a message of this protocol; then `why`, if given, says what is
// wrong with it ("sent data of 49153 bytes on channel 3, more than ..."), or that it is not one.
std::optional<NodeMessage> decode_message(const std::string& line, std::string* why = nullptr);

// The word a message of `kind` starts with on the wire: "hello", "data".
const char* message_word(MessageKind kind);

std::vector<std::string> split_words(const std::string& line);


// "1, 3" (for messages to people); "1,3" with `separator` ",".
std::string join_ranks(const std::vector<int>& ranks, const char* separator = ", ");

}  // namespace cpprun::launcher
