// See evidence_collector.h.
#include "rendezvous/evidence_collector.h"

#include <algorithm>
#include <cstddef>
#include <iostream>
#include <string>

namespace cpprun::launcher {
namespace {

void mark_done(const std::vector<int>& done, std::map<int, NodeEvidence>& heard) {
  for (int node : done) heard[node].done = true;
}

std::size_t text_bytes(const std::string& text) { return sizeof(std::string) + text.capacity(); }

// The rank's evidence without its dump, its texts cut: Note [Evidence kept for one node].
RankEvidence set_aside_dump(const RankEvidence& evidence, const std::string& who) {
  RankEvidence kept;
  kept.rank = evidence.rank;
  kept.fate = evidence.fate.substr(0, kSetAsideTextBytes);
  kept.no_dump_reason = evidence.dump ? "its dump was set aside: " + who.substr(0, kSetAsideTextBytes) +
                                            " sent more evidence than node 0 keeps for one node"
                                      : evidence.no_dump_reason.substr(0, kSetAsideTextBytes);
  return kept;
}

}  // namespace

std::size_t evidence_bytes(const RankEvidence& evidence) {
  std::size_t bytes = sizeof(RankEvidence) + text_bytes(evidence.fate) + text_bytes(evidence.no_dump_reason);
  if (!evidence.dump) return bytes;
  const FlightDump& dump = *evidence.dump;
  bytes += text_bytes(dump.reason) + dump.entries.capacity() * sizeof(CollectiveRecord);
  for (const CollectiveRecord& r : dump.entries) {
    for (const std::string* text : {&r.group, &r.op, &r.dtype, &r.shapes, &r.reduce_op, &r.label, &r.public_call}) {
      bytes += text->capacity() > 15 ? text->capacity() + 1 : 0;  // beyond the string's own (short) buffer
    }
    bytes += r.group_ranks.capacity() * sizeof(int);
  }
  return bytes;
}

void EvidenceCollector::start_round(int round, std::vector<NodeSlice> nodes) {
  round_ = round;
  nodes_ = std::move(nodes);
  heard_.clear();
  request_.reset();  // a request of the previous round gets no more answers
  too_much_.clear();
  too_large_.clear();
}

void EvidenceCollector::own_done() { heard_[0].done = true; }

void EvidenceCollector::own_evidence(std::vector<RankEvidence> ranks) { heard_[0].ranks = std::move(ranks); }

void EvidenceCollector::node_gone(int group_rank, const std::string& why) {
  heard_[group_rank].gone = why;
  if (request_) request_->heard[group_rank].gone = why;
}

void EvidenceCollector::receive(const Sender& from, const NodeMessage& message) {
  switch (evidence_for(message.round, message.request, round_, request_ ? request_->number : 0)) {
    case EvidenceFor::kFailure:
      keep(from, message.evidence, 0, heard_);
      break;
    case EvidenceFor::kOpenRequest:
      keep(from, message.evidence, request_->number, request_->heard);
      break;
    case EvidenceFor::kStale:  // a late answer to a request already answered
      break;
  }
}

// merge_node_evidence() sets aside what is not the node's; here, the count and the bytes are bounded.
void EvidenceCollector::keep(const Sender& from, const RankEvidence& evidence, int request,
                             std::map<int, NodeEvidence>& into) {
  NodeEvidence& heard = into[from.group_rank];
  if (heard.ranks.size() >= static_cast<std::size_t>(from.local_world_size)) {
    if (too_much_.insert({request, from.group_rank}).second) {
      std::cerr << "cpprun: warning: " << from.who << " sent more evidence than it has ranks ("
                << from.local_world_size << "): the rest is set aside\n";
    }
    return;
  }
  std::size_t bytes = evidence_bytes(evidence);
  if (heard.kept_bytes + bytes <= kMaxEvidenceKeptPerNode) {
    heard.ranks.push_back(evidence);
  } else {  // Note [Evidence kept for one node]
    if (too_large_.insert({request, from.group_rank}).second) {
      std::cerr << "cpprun: warning: " << from.who << " sent more than the " << (kMaxEvidenceKeptPerNode >> 20)
                << " MiB of flight-recorder evidence node 0 keeps for one node: the dumps of its other ranks are "
                   "set aside\n";
    }
    heard.ranks.push_back(set_aside_dump(evidence, from.who));
    bytes = evidence_bytes(heard.ranks.back());
  }
  heard.kept_bytes += bytes;
}

bool EvidenceCollector::member_awaited(const std::map<int, NodeEvidence>& heard) const {
  const std::vector<int> awaited = awaited_nodes(nodes_, heard);
  return std::any_of(awaited.begin(), awaited.end(), [](int node) { return node != 0; });
}

bool EvidenceCollector::failure_awaited(const std::vector<int>& done) {
  mark_done(done, heard_);
  return member_awaited(heard_);
}

MergedEvidence EvidenceCollector::merge_failure(std::chrono::milliseconds waited) const {
  return merge_node_evidence(nodes_, heard_, waited);
}

int EvidenceCollector::open_request() {
  request_ = OpenRequest{++last_request_, {}};
  return request_->number;
}

bool EvidenceCollector::request_awaited(int request, const std::vector<int>& done) {
  if (!request_ || request_->number != request) return false;
  mark_done(done, request_->heard);
  return member_awaited(request_->heard);
}

MergedEvidence EvidenceCollector::close_request(int request, std::vector<RankEvidence> own,
                                                const std::vector<int>& done, std::chrono::milliseconds waited) {
  std::map<int, NodeEvidence> heard;
  if (request_ && request_->number == request) heard = std::move(request_->heard);
  request_.reset();  // from now on, its answers are stale
  mark_done(done, heard);
  heard[0].ranks = std::move(own);
  return merge_node_evidence(nodes_, heard, waited);
}

}  // namespace cpprun::launcher
