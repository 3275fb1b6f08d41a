// Unit tests of node 0's merging of every node's evidence (diagnosis/node_evidence.h): one entry per
// rank of the job, the nodes it heard nothing of named, what is not a node's set aside.
#include "catch.h"

#include <map>
#include <string>
#include <vector>

#include "diagnosis/node_evidence.h"

using namespace cpprun::launcher;
using Catch::Matchers::Contains;
using namespace std::chrono_literals;

namespace {

RankEvidence with_dump(int rank, int dump_rank = -1) {
  RankEvidence e;
  e.rank = rank;
  FlightDump& d = e.dump.emplace();
  d.rank = dump_rank < 0 ? rank : dump_rank;
  d.world_size = 5;
  CollectiveRecord c;
  c.group = "world";
  c.seq = 6;
  c.op = "all_gather";
  c.dtype = "float32";
  c.shapes = "[1024]";
  c.start_unix_ms = 1000;
  d.entries.push_back(c);
  d.dumped_unix_ms = 3000;
  return e;
}

// Node 0: ranks 0-1; node 1: ranks 2-3; node 2: rank 4.
const std::vector<NodeSlice> kNodes = {{0, 0, 2}, {1, 2, 2}, {2, 4, 1}};

std::string lines(const MergedEvidence& merged) {
  std::string all;
  for (const std::string& l : diagnose(merged.ranks, "test").lines) all += l + "\n";
  return all;
}

}  // namespace

TEST_CASE("node_evidence: every node heard from gives every rank, in order", "[node_evidence]") {
  std::map<int, NodeEvidence> heard;
  heard[0].ranks = {with_dump(1), with_dump(0)};
  heard[1].ranks = {with_dump(3), with_dump(2)};
  heard[2].ranks = {with_dump(4)};
  CHECK(awaited_nodes(kNodes, heard).empty());
  const MergedEvidence merged = merge_node_evidence(kNodes, heard, 5s);
  REQUIRE(merged.ranks.size() == 5);
  for (int r = 0; r < 5; ++r) {
    CHECK(merged.ranks[r].rank == r);
    CHECK(merged.ranks[r].dump);
  }
  CHECK(merged.refused.empty());
  CHECK_THAT(lines(merged), Contains("ranks 0-4 wait in all_gather #6"));
}

TEST_CASE("node_evidence: a node not heard from in time is named, its ranks in one line", "[node_evidence]") {
  std::map<int, NodeEvidence> heard;
  heard[0].ranks = {with_dump(0), with_dump(1)};
  heard[2].ranks = {with_dump(4)};
  CHECK(awaited_nodes(kNodes, heard) == std::vector<int>{1});
  const MergedEvidence merged = merge_node_evidence(kNodes, heard, 5s);
  REQUIRE(merged.ranks.size() == 5);
  CHECK_FALSE(merged.ranks[2].dump);
  CHECK(merged.ranks[2].no_dump_reason == "node 1 sent no evidence within 5 s");
  const std::string text = lines(merged);
  CHECK_THAT(text, Contains("no dump from ranks 2-3 (fate unknown): node 1 sent no evidence within 5 s"));
  CHECK_THAT(text, Contains("ranks 0-1, 4 wait in all_gather #6"));

  // Part of a node's ranks: the node is still awaited; the rest are named one by one.
  heard[1].ranks = {with_dump(3)};
  CHECK(awaited_nodes(kNodes, heard) == std::vector<int>{1});
  CHECK_THAT(lines(merge_node_evidence(kNodes, heard, 2500ms)),
             Contains("no dump from rank 2 (fate unknown): node 1 sent no evidence of this rank within 2.5 s"));
}

TEST_CASE("node_evidence: a node that is gone, or was done, is not waited for", "[node_evidence]") {
  std::map<int, NodeEvidence> heard;
  heard[0].ranks = {with_dump(0), with_dump(1)};
  heard[1].gone = "is gone: it was killed, or its host or network went down";
  heard[2].done = true;
  CHECK(awaited_nodes(kNodes, heard).empty());
  const std::string text = lines(merge_node_evidence(kNodes, heard, 5s));
  CHECK_THAT(text, Contains("no dump from ranks 2-3 (fate unknown): node 1 sent no evidence: its agent is gone"));
  CHECK_THAT(text, Contains("no dump from rank 4 (had finished (exited with code 0)): node 2's workers had all "
                            "succeeded before the round ended"));
}

TEST_CASE("node_evidence: evidence that is not the node's is set aside and said", "[node_evidence]") {
  std::map<int, NodeEvidence> heard;
  heard[0].ranks = {with_dump(0), with_dump(1)};
  heard[1].ranks = {with_dump(0), with_dump(2), with_dump(2), with_dump(3, 1)};  // another's rank, twice, a dump of 1
  heard[2].ranks = {with_dump(4)};
  const MergedEvidence merged = merge_node_evidence(kNodes, heard, 5s);
  REQUIRE(merged.ranks.size() == 5);
  CHECK(merged.ranks[0].dump);  // node 0's own, not node 1's claim
  CHECK_FALSE(merged.ranks[3].dump);
  CHECK(merged.ranks[3].no_dump_reason == "its dump said it was rank 1");
  REQUIRE(merged.refused.size() == 3);
  CHECK(merged.refused[0] == "node 1 sent evidence of rank 0, which is not one of its ranks (2-3): set aside");
  CHECK(merged.refused[1] == "node 1 sent evidence of rank 2 twice: the first kept");
  CHECK(merged.refused[2] == "node 1 sent evidence of rank 3 with the dump of rank 1: that dump set aside");
}

TEST_CASE("node_evidence: an evidence message belongs to the round's failure, the open request, or neither",
          "[node_evidence]") {
  // A failure's evidence (request 0) of the running round, whether a request is open or not.
  CHECK(evidence_for(3, 0, 3, 0) == EvidenceFor::kFailure);
  CHECK(evidence_for(3, 0, 3, 2) == EvidenceFor::kFailure);
  // The answer to the request node 0 collects now.
  CHECK(evidence_for(3, 2, 3, 2) == EvidenceFor::kOpenRequest);
  // A late answer to request 1 while request 2 is open, or once none is: never taken for the new one.
  CHECK(evidence_for(3, 1, 3, 2) == EvidenceFor::kStale);
  CHECK(evidence_for(3, 2, 3, 0) == EvidenceFor::kStale);
  // An answer to a request not made yet (a peer guessing numbers) is no answer either.
  CHECK(evidence_for(3, 3, 3, 2) == EvidenceFor::kStale);
  // Another round's evidence, failure or answer: the workers it describes are gone.
  CHECK(evidence_for(2, 0, 3, 0) == EvidenceFor::kStale);
  CHECK(evidence_for(2, 2, 3, 2) == EvidenceFor::kStale);
  CHECK(evidence_for(4, 2, 3, 2) == EvidenceFor::kStale);
  // Hostile numbers.
  CHECK(evidence_for(3, -1, 3, 0) == EvidenceFor::kStale);
  CHECK(evidence_for(3, -2, 3, -2) == EvidenceFor::kStale);
  CHECK(evidence_for(3, 1 << 30, 3, 2) == EvidenceFor::kStale);
}

TEST_CASE("node_evidence: a request is owed by the nodes not heard from in full, until they answer",
          "[node_evidence]") {
  // As node 0 sees request 2 while its own ranks are still being dumped: every other node owes it.
  std::map<int, NodeEvidence> heard;
  CHECK(awaited_nodes(kNodes, heard) == std::vector<int>{0, 1, 2});
  heard[2].ranks = {with_dump(4)};
  heard[1].ranks = {with_dump(2)};
  CHECK(awaited_nodes(kNodes, heard) == std::vector<int>{0, 1});
  // A hostile node answering with another node's rank, or one of its ranks twice, still owes the rest.
  heard[1].ranks.push_back(with_dump(4));
  heard[1].ranks.push_back(with_dump(2));
  CHECK(awaited_nodes(kNodes, heard) == std::vector<int>{0, 1});
  heard[1].ranks.push_back(with_dump(3));
  heard[0].ranks = {with_dump(0), with_dump(1)};
  CHECK(awaited_nodes(kNodes, heard).empty());
  const MergedEvidence merged = merge_node_evidence(kNodes, heard, 1200ms);
  REQUIRE(merged.ranks.size() == 5);
  for (const RankEvidence& r : merged.ranks) CHECK(r.dump);
  REQUIRE(merged.refused.size() == 2);
  CHECK(merged.refused[0] == "node 1 sent evidence of rank 4, which is not one of its ranks (2-3): set aside");
  CHECK(merged.refused[1] == "node 1 sent evidence of rank 2 twice: the first kept");
}
