// One diagnosis for a multi-node job (Note [One diagnosis for several nodes] in node_rendezvous.h):
// what node 0 has heard of every node's evidence when it stops waiting, merged into one RankEvidence
// per rank of the job for diagnose(), with the ranks it heard nothing of named as such. Pure, so
// unit-tested; the waiting and the links are the rendezvous host's.
#pragma once

#include <chrono>
#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "diagnosis/hang_diagnosis.h"

namespace cpprun::launcher {

// One node's ranks in the round: base_rank .. base_rank + local_world_size - 1.
struct NodeSlice {
  int node = 0;
  int base_rank = 0;
  int local_world_size = 0;
};

// What node 0 has of one node when it diagnoses.
struct NodeEvidence {
  std::vector<RankEvidence> ranks;  // as received, in any order (node 0's own: gathered here)
  bool done = false;                // its workers had all succeeded before the round ended: nothing to send
  std::string gone;                 // its agent is gone: why ("is gone: it was killed, ...")
  std::size_t kept_bytes = 0;       // about what `ranks` holds in memory (EvidenceCollector's bound)
};

// How long node 0 waits for the other nodes' evidence once its own is gathered: they gather theirs
// meanwhile (up to 2 s each, as node 0 does), so this is slack for a slow link or a busy agent.
inline constexpr std::chrono::seconds kEvidenceWait{5};

// The nodes still to be heard from: neither done nor gone, and without every rank's evidence.
std::vector<int> awaited_nodes(const std::vector<NodeSlice>& nodes, const std::map<int, NodeEvidence>& heard);

// Which of node 0's collections an evidence message belongs to (Note [Diagnosis on request across
// nodes] in node_rendezvous.h): the running round's failure (request 0), the request node 0 waits
// for now, or neither -- another round's, or a late answer to a request already answered.
enum class EvidenceFor { kFailure, kOpenRequest, kStale };
// `open_request`: the number of the request node 0 collects now, 0 when none.
EvidenceFor evidence_for(int message_round, int message_request, int current_round, int open_request);

struct MergedEvidence {
  std::vector<RankEvidence> ranks;    // one per rank of every node, by rank
  std::vector<std::string> refused;   // evidence set aside: a rank not the node's, a rank sent twice, ...
};

// `waited`: how long node 0 waited for the others, for the ranks it heard nothing of.
MergedEvidence merge_node_evidence(const std::vector<NodeSlice>& nodes, const std::map<int, NodeEvidence>& heard,
                                   std::chrono::milliseconds waited);

}  // namespace cpprun::launcher
