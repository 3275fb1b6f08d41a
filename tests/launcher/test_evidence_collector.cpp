// Unit tests of the rendezvous host's evidence for a diagnosis across nodes
// (rendezvous/evidence_collector.h), without a socket: who is still awaited, a node's evidence
// bounded by its ranks, and answers to a closed, replaced or earlier round's request set aside.
#include "catch.h"

#include <cstddef>
#include <string>
#include <vector>

#include "rendezvous/evidence_collector.h"

using namespace cpprun::launcher;
using namespace std::chrono_literals;

namespace {

// Node 0 (the host): ranks 0-1; node 1: ranks 2-3; node 2: rank 4.
const std::vector<NodeSlice> kNodes = {{0, 0, 2}, {1, 2, 2}, {2, 4, 1}};

const EvidenceCollector::Sender kNode1{1, 2, "the agent of node 1 (10.0.0.2:4000)"};
const EvidenceCollector::Sender kNode2{2, 1, "the agent of node 2 (10.0.0.3:4000)"};

RankEvidence exited(int rank) {
  RankEvidence e;
  e.rank = rank;
  e.no_dump_reason = "no dump";
  e.fate = "exited with code 3";
  return e;
}

NodeMessage evidence(int round, int rank, int request = 0) {
  return NodeMessage::make_evidence(round, exited(rank), request);
}

// How many of the merged ranks are the senders' own (not a placeholder for a rank heard nothing of).
int heard_ranks(const MergedEvidence& merged) {
  int n = 0;
  for (const RankEvidence& r : merged.ranks) n += r.fate == "exited with code 3" ? 1 : 0;
  return n;
}

}  // namespace

TEST_CASE("evidence_collector: the failure awaits the members not heard from in full, never a done or gone one",
          "[evidence_collector]") {
  EvidenceCollector c;
  c.start_round(0, kNodes);
  c.own_evidence({exited(0), exited(1)});
  CHECK(c.failure_awaited({}));
  c.receive(kNode1, evidence(0, 2));
  CHECK(c.failure_awaited({}));  // node 1 has two ranks
  c.receive(kNode1, evidence(0, 3));
  CHECK(c.failure_awaited({}));  // node 2
  CHECK_FALSE(c.failure_awaited({2}));  // its workers had all succeeded: nothing to send
  CHECK(heard_ranks(c.merge_failure(5s)) == 4);

  EvidenceCollector gone;
  gone.start_round(0, kNodes);
  gone.receive(kNode1, evidence(0, 2));
  gone.receive(kNode1, evidence(0, 3));
  CHECK(gone.failure_awaited({}));
  gone.node_gone(2, "is gone: it was killed");
  CHECK_FALSE(gone.failure_awaited({}));  // the host is never awaited: its own are gathered where it runs
}

TEST_CASE("evidence_collector: a node's messages beyond its number of ranks are set aside", "[evidence_collector]") {
  EvidenceCollector c;
  c.start_round(0, kNodes);
  c.receive(kNode2, evidence(0, 4));
  c.receive(kNode2, evidence(0, 4));  // node 2 has one rank: not kept, so not merged twice
  c.receive(kNode2, evidence(0, 4));
  const MergedEvidence merged = c.merge_failure(5s);
  CHECK(merged.refused.empty());
  CHECK(heard_ranks(merged) == 1);
}

TEST_CASE("evidence_collector: a request's answers are its own; closed or replaced, later ones are stale",
          "[evidence_collector]") {
  EvidenceCollector c;
  c.start_round(3, kNodes);
  const int first = c.open_request();
  CHECK(first == 1);
  CHECK(c.request_awaited(first, {}));
  c.receive(kNode1, evidence(3, 2, first));
  c.receive(kNode2, evidence(3, 4, first));
  CHECK(c.failure_awaited({}));  // answers to a request are not the failure's
  const int second = c.open_request();  // replaces the first
  CHECK(second == 2);
  CHECK_FALSE(c.request_awaited(first, {}));
  c.receive(kNode1, evidence(3, 3, first));  // late: set aside
  c.receive(kNode2, evidence(3, 4, second));
  c.receive(kNode1, evidence(3, 2, second));
  CHECK(c.request_awaited(second, {}));  // node 1 still owes rank 3: the late answer was not the second's
  c.receive(kNode1, evidence(3, 3, second));
  CHECK_FALSE(c.request_awaited(second, {}));
  const MergedEvidence merged = c.close_request(second, {exited(0), exited(1)}, {}, 5s);
  CHECK(heard_ranks(merged) == 5);
  CHECK(merged.refused.empty());
  CHECK_FALSE(c.request_awaited(second, {}));
  c.receive(kNode2, evidence(3, 4, second));  // after the close: stale
  CHECK(heard_ranks(c.merge_failure(5s)) == 0);  // no answer was taken for the failure's evidence
}

TEST_CASE("evidence_collector: a new round drops what was heard, and the open request with it",
          "[evidence_collector]") {
  EvidenceCollector c;
  c.start_round(0, kNodes);
  c.receive(kNode1, evidence(0, 2));
  c.receive(kNode1, evidence(0, 3));
  c.receive(kNode2, evidence(0, 4));
  CHECK_FALSE(c.failure_awaited({}));
  const int request = c.open_request();
  c.start_round(1, kNodes);
  CHECK(c.failure_awaited({}));
  CHECK_FALSE(c.request_awaited(request, {}));
  c.receive(kNode2, evidence(0, 4));  // of round 0: stale
  CHECK(heard_ranks(c.merge_failure(5s)) == 0);
  CHECK(c.open_request() == request + 1);  // numbered for the whole job
}

// Note [Evidence kept for one node]: a member holding the secret may say it runs 65,536 workers and
// send a full message for each; node 0 once kept them all (about 1.4 MB each in memory).
TEST_CASE("evidence_collector: past kMaxEvidenceKeptPerNode a node's dumps are set aside, its ranks still named",
          "[evidence_collector]") {
  const int claimed = 4096;
  const std::vector<NodeSlice> nodes = {{0, 0, 1}, {1, 1, claimed}};
  const EvidenceCollector::Sender big{1, claimed, "the agent of node 1 (10.0.0.2:4000)"};
  FlightDump dump;
  dump.rank = 1;
  dump.world_size = claimed + 1;
  dump.reason = "failure";
  for (int i = 0; i < 2000; ++i) {
    CollectiveRecord r;
    r.group = "default_pg";
    r.seq = i + 1;
    r.op = "send";
    r.dtype = "float32";
    r.shapes = "[4096]";
    r.label = std::string(kMaxLabelBytes, 'x');
    dump.entries.push_back(r);
  }
  EvidenceCollector c;
  c.start_round(0, nodes);
  std::size_t per_rank = 0;
  int sent = 0;
  for (; sent < claimed; ++sent) {
    RankEvidence e = exited(1 + sent);
    e.dump = dump;
    e.dump->rank = 1 + sent;
    const NodeMessage message = NodeMessage::make_evidence(0, std::move(e), 0);
    REQUIRE(message.evidence.dump.has_value());
    const RankEvidence kept_copy = message.evidence;  // as the collector keeps it: a copy
    per_rank = evidence_bytes(kept_copy);
    c.receive(big, message);
    if (static_cast<std::size_t>(sent + 1) * per_rank > kMaxEvidenceKeptPerNode + 20 * per_rank) break;
  }
  ++sent;
  REQUIRE(per_rank > 300 * 1000);  // each message near the wire's bound: the test needs few of them
  const MergedEvidence merged = c.merge_failure(5s);
  int with_dump = 0, set_aside = 0;
  std::size_t kept = 0;
  for (const RankEvidence& r : merged.ranks) {
    if (r.rank == 0 || r.fate != "exited with code 3") continue;  // node 0, or a rank heard nothing of
    kept += evidence_bytes(r);
    if (r.dump) {
      ++with_dump;
    } else {
      CHECK(r.no_dump_reason.find("its dump was set aside: the agent of node 1") == 0);
      ++set_aside;
    }
  }
  CHECK(with_dump + set_aside == sent);  // every rank named, with its fate
  CHECK(with_dump == static_cast<int>(kMaxEvidenceKeptPerNode / per_rank));
  CHECK(set_aside >= 19);
  CHECK(kept <= kMaxEvidenceKeptPerNode + static_cast<std::size_t>(set_aside) * 1024);
}
