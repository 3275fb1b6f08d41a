// The evidence for a diagnosis across nodes, as the rendezvous host hears it (Note [One diagnosis
// for several nodes], Note [Diagnosis on request across nodes] in node_rendezvous.h): its own ranks'
// and each member's, for the round's failure and for the `cpprun --diagnose` request it answers. The
// host (rendezvous_host.cpp) forwards what it hears and waits on its links; this class keeps what
// came, no more than a node has ranks and kMaxEvidenceKeptPerNode of it (Note [Bounding a peer's
// evidence]), sets aside stale answers, and says who is still awaited. No sockets, so unit-tested.
#pragma once

#include <chrono>
#include <cstddef>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "diagnosis/node_evidence.h"
#include "rendezvous/node_messages.h"

namespace cpprun::launcher {

// Note [Evidence kept for one node]
// A message is bounded (kMaxEvidenceBytes on the wire) and so is their number (the node's ranks), but
// a member may say it runs up to 65,536 workers (admission.h), and each message decodes to about three
// times its bytes: a member holding the secret could make node 0 hold some 90 GB. So node 0 keeps at
// most kMaxEvidenceKeptPerNode of one node's evidence (for the failure, and again for each request):
// past it, a rank's dump is set aside and its texts cut, and the rank is still named with its fate.
// 128 MiB keeps every dump of a node of 64 ranks whose recorders are full (2,000 entries, about 1 MB
// each in memory); a real node has a few ranks and dumps of a few hundred KB.
inline constexpr std::size_t kMaxEvidenceKeptPerNode = std::size_t{128} << 20;
// A rank's texts past the bound are cut to this many bytes.
inline constexpr std::size_t kSetAsideTextBytes = 200;

// About how many bytes `evidence` holds in memory: its strings, vectors and records.
std::size_t evidence_bytes(const RankEvidence& evidence);

class EvidenceCollector {
 public:
  // The member an evidence message came from, as the host knows it.
  struct Sender {
    int group_rank = -1;
    int local_world_size = 0;  // its ranks: no more messages than these are kept
    std::string who;           // "the agent of node 1 (10.0.0.2:41234)", for the warning
  };

  // Round `round` starts with `nodes` (by group rank, the host first): what was heard of the last
  // round is dropped, and a request still open gets no more answers.
  void start_round(int round, std::vector<NodeSlice> nodes);

  void own_done();                                      // the host's workers all succeeded: nothing to send
  void own_evidence(std::vector<RankEvidence> ranks);   // the host's ranks', for the round's failure
  void node_gone(int group_rank, const std::string& why);  // a member's agent is gone while the round ran
  // An evidence message of the running round from `from`: the failure's, the open request's, or stale.
  // A node that sends more than it has ranks, or more than kMaxEvidenceKeptPerNode, is warned about
  // once per request (0: the failure) and each reason.
  void receive(const Sender& from, const NodeMessage& message);

  // `done`: the group ranks of the members whose workers had all succeeded: they have nothing to
  // send, and are not awaited from now on.
  // Whether a member still owes the round's failure its evidence.
  bool failure_awaited(const std::vector<int>& done);
  // Every node's evidence of the failure as heard so far; `waited` for the ranks heard nothing of.
  MergedEvidence merge_failure(std::chrono::milliseconds waited) const;

  // A new `cpprun --diagnose` request (numbered from 1 for the whole job), replacing an open one.
  int open_request();
  // Whether a member still owes `request` its answer (false once the request is closed or replaced).
  bool request_awaited(int request, const std::vector<int>& done);
  // Closes `request` and merges its answers with the host's `own`: later answers are stale.
  MergedEvidence close_request(int request, std::vector<RankEvidence> own, const std::vector<int>& done,
                               std::chrono::milliseconds waited);

 private:
  // A `cpprun --diagnose` on the host whose answers are awaited.
  struct OpenRequest {
    int number = 0;
    std::map<int, NodeEvidence> heard;  // by group rank, as heard_
  };

  void keep(const Sender& from, const RankEvidence& evidence, int request, std::map<int, NodeEvidence>& into);
  bool member_awaited(const std::map<int, NodeEvidence>& heard) const;

  int round_ = 0;
  std::vector<NodeSlice> nodes_;       // this round's nodes and their ranks, the host first
  std::map<int, NodeEvidence> heard_;  // by group rank, for the round's failure
  std::optional<OpenRequest> request_;
  int last_request_ = 0;
  std::set<std::pair<int, int>> too_much_;   // (request, node) warned about this round: more than its ranks
  std::set<std::pair<int, int>> too_large_;  // (request, node) warned about this round: more than the bytes
};

}  // namespace cpprun::launcher
