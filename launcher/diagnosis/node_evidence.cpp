// Merging the nodes' evidence into one view of the job's ranks, and naming what is missing.
#include "diagnosis/node_evidence.h"

#include <algorithm>
#include <set>

#include "common/formatting.h"

namespace cpprun::launcher {
namespace {

constexpr const char* kUnknownFate = "fate unknown";

bool complete(const NodeSlice& slice, const NodeEvidence& e) {
  std::set<int> ranks;
  for (const RankEvidence& r : e.ranks) {
    if (r.rank >= slice.base_rank && r.rank < slice.base_rank + slice.local_world_size) ranks.insert(r.rank);
  }
  return static_cast<int>(ranks.size()) >= slice.local_world_size;
}

// Why a rank of `slice` has no evidence, and what is known of its fate.
RankEvidence placeholder(int rank, const NodeSlice& slice, const NodeEvidence* heard, std::chrono::milliseconds waited) {
  const std::string node = "node " + std::to_string(slice.node);
  RankEvidence e;
  e.rank = rank;
  e.fate = kUnknownFate;
  if (heard != nullptr && heard->done) {
    e.fate = "had finished (exited with code 0)";
    e.no_dump_reason = node + "'s workers had all succeeded before the round ended";
  } else if (heard != nullptr && !heard->gone.empty()) {
    e.no_dump_reason = node + " sent no evidence: its agent " + heard->gone;
  } else if (heard != nullptr && !heard->ranks.empty()) {
    e.no_dump_reason = node + " sent no evidence of this rank within " + decimal_seconds(waited) + " s";
  } else {
    e.no_dump_reason = node + " sent no evidence within " + decimal_seconds(waited) + " s";
  }
  return e;
}

}  // namespace

std::vector<int> awaited_nodes(const std::vector<NodeSlice>& nodes, const std::map<int, NodeEvidence>& heard) {
  std::vector<int> awaited;
  for (const NodeSlice& slice : nodes) {
    const auto it = heard.find(slice.node);
    if (it == heard.end() || (!it->second.done && it->second.gone.empty() && !complete(slice, it->second))) {
      awaited.push_back(slice.node);
    }
  }
  return awaited;
}

EvidenceFor evidence_for(int message_round, int message_request, int current_round, int open_request) {
  if (message_round != current_round || message_request < 0) return EvidenceFor::kStale;
  if (message_request == 0) return EvidenceFor::kFailure;
  return open_request > 0 && message_request == open_request ? EvidenceFor::kOpenRequest : EvidenceFor::kStale;
}

MergedEvidence merge_node_evidence(const std::vector<NodeSlice>& nodes, const std::map<int, NodeEvidence>& heard,
                                   std::chrono::milliseconds waited) {
  MergedEvidence merged;
  for (const NodeSlice& slice : nodes) {
    const auto it = heard.find(slice.node);
    const NodeEvidence* from = it == heard.end() ? nullptr : &it->second;
    const std::string node = "node " + std::to_string(slice.node);
    std::map<int, RankEvidence> ranks;  // this node's, by rank
    for (const RankEvidence& r : from != nullptr ? from->ranks : std::vector<RankEvidence>{}) {
      const std::string what = node + " sent evidence of rank " + std::to_string(r.rank);
      if (r.rank < slice.base_rank || r.rank >= slice.base_rank + slice.local_world_size) {
        const int last = slice.base_rank + slice.local_world_size - 1;
        merged.refused.push_back(what + ", which is not one of its ranks (" + std::to_string(slice.base_rank) +
                                 (last > slice.base_rank ? "-" + std::to_string(last) : "") + "): set aside");
        continue;
      }
      if (ranks.count(r.rank) != 0) {
        merged.refused.push_back(what + " twice: the first kept");
        continue;
      }
      RankEvidence kept = r;
      if (kept.dump && kept.dump->rank != kept.rank) {
        merged.refused.push_back(what + " with the dump of rank " + std::to_string(kept.dump->rank) +
                                 ": that dump set aside");
        kept.dump.reset();
        kept.no_dump_reason = "its dump said it was rank " + std::to_string(r.dump->rank);
      }
      ranks.emplace(r.rank, std::move(kept));
    }
    for (int rank = slice.base_rank; rank < slice.base_rank + slice.local_world_size; ++rank) {
      const auto got = ranks.find(rank);
      merged.ranks.push_back(got != ranks.end() ? std::move(got->second) : placeholder(rank, slice, from, waited));
    }
  }
  std::sort(merged.ranks.begin(), merged.ranks.end(),
            [](const RankEvidence& a, const RankEvidence& b) { return a.rank < b.rank; });
  return merged;
}

}  // namespace cpprun::launcher
