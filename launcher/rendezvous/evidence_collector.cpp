// See evidence_collector.h.
#include "rendezvous/evidence_collector.h"

#include <algorithm>
#include <iostream>

namespace cpprun::launcher {
namespace {

void mark_done(const std::vector<int>& done, std::map<int, NodeEvidence>& heard) {
  for (int node : done) heard[node].done = true;
}

}  // namespace

void EvidenceCollector::start_round(int round, std::vector<NodeSlice> nodes) {
  round_ = round;
  nodes_ = std::move(nodes);
  heard_.clear();
  request_.reset();  // a request of the previous round gets no more answers
  too_much_.clear();
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

// merge_node_evidence() sets aside what is not the node's; here, only the count is bounded.
void EvidenceCollector::keep(const Sender& from, const RankEvidence& evidence, int request,
                             std::map<int, NodeEvidence>& into) {
  NodeEvidence& heard = into[from.group_rank];
  if (heard.ranks.size() < static_cast<std::size_t>(from.local_world_size)) {
    heard.ranks.push_back(evidence);
  } else if (too_much_.insert({request, from.group_rank}).second) {
    std::cerr << "cpprun: warning: " << from.who << " sent more evidence than it has ranks (" << from.local_world_size
              << "): the rest is set aside\n";
  }
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
