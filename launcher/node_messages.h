// What the agents of a multi-node job say to each other over their links (node_link.h): one
// message per line, words separated by spaces, each word escaped. Pure, so unit-tested.
//
// Node 0's agent (the host) and each other agent (a member) talk like this:
//   member -> host   hello     who I am: node rank, nnodes, nproc, max_restarts, run id, role
//   host -> member   waiting   the node ranks still missing (after every arrival)
//   host -> member   start     round N begins: your ranks
//   member -> host   done      my workers of round N all succeeded
//   member -> host   failed    round N failed here (a worker, or a signal to this agent)
//   host -> member   end       round N is over (failed somewhere): stop your workers
//   member -> host   stopped   my workers of round N are stopped
//   host -> member   exit      the job is over: exit with this code (0 when every node was done)
// A restart is a new `start` with the next round number.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "rank_layout.h"

namespace cpprun::launcher {

// Bumped when a message changes; agents of different versions refuse each other at `hello`.
inline constexpr int kNodeProtocolVersion = 1;

enum class MessageKind { kHello, kWaiting, kStart, kDone, kFailed, kStopped, kEnd, kExit };

struct NodeHello {
  int protocol = kNodeProtocolVersion;
  int node_rank = 0;
  int nnodes = 1;
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
  int round = 0;                 // kStart, kDone, kFailed, kStopped, kEnd
  NodeHello hello;               // kHello
  std::vector<int> missing;      // kWaiting: node ranks not joined yet
  RankLayout layout;             // kStart: base/world ranks (the member knows its own group rank)
  JobEnd end;                    // kFailed, kEnd, kExit

  static NodeMessage make_hello(const NodeHello& hello);
  static NodeMessage make_waiting(std::vector<int> missing);
  static NodeMessage make_start(int round, const RankLayout& layout);
  static NodeMessage make_done(int round);
  static NodeMessage make_failed(int round, JobEnd end);
  static NodeMessage make_stopped(int round);
  static NodeMessage make_end(int round, JobEnd end);
  static NodeMessage make_exit(JobEnd end);
};

// One line, without the newline.
std::string encode_message(const NodeMessage& message);
// nullopt for a line that is not a message of this protocol.
std::optional<NodeMessage> decode_message(const std::string& line);

// "1, 3" (for messages to people).
std::string join_ranks(const std::vector<int>& ranks);

}  // namespace cpprun::launcher
