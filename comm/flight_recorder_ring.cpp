// The flight recorder's ring buffer. See flight_recorder_ring.h.
#include "comm/flight_recorder_ring.h"

#include <c10/core/ScalarType.h>

#include <algorithm>

namespace cpprun::detail {
namespace {

FlightRecorderEntry to_entry(const RecordedCall& call, CollectiveState state, int64_t end_unix_ms) {
  FlightRecorderEntry entry;
  if (call.group) {
    entry.group = call.group->name;
    entry.group_ranks = call.group->ranks;
  }
  entry.seq = call.seq;
  entry.op = call.op;
  if (call.dtype) entry.dtype = std::string(c10::getDtypeNames(*call.dtype).first);
  for (uint8_t t = 0; t < call.tensor_count; ++t) {
    entry.shapes.emplace_back(call.shapes[t].begin(), call.shapes[t].end());
  }
  if (call.reduce) entry.reduce_op = std::string(to_string(*call.reduce));
  entry.root = call.root;
  entry.tag = call.tag;
  entry.label = call.label;
  if (call.public_call != nullptr) entry.public_call = std::string(call.public_call);
  entry.state = state;
  entry.start_unix_ms = call.start_unix_ms;
  if (state != CollectiveState::kStarted) entry.end_unix_ms = end_unix_ms;
  return entry;
}

}  // namespace

FlightRecorderRing::FlightRecorderRing(std::size_t capacity) : slots_(capacity) {}

uint64_t FlightRecorderRing::start(RecordedCall&& call) {
  if (slots_.empty()) return 0;
  std::lock_guard<std::mutex> lock(mutex_);
  const uint64_t id = next_id_++;
  Slot& slot = slots_[(id - 1) % slots_.size()];
  slot.id = id;
  slot.call = std::move(call);
  slot.state = CollectiveState::kStarted;
  slot.end_unix_ms = 0;
  return id;
}

bool FlightRecorderRing::finish(uint64_t id, CollectiveState state, int64_t end_unix_ms, int64_t* start_unix_ms) {
  if (slots_.empty() || id == 0) return false;
  std::lock_guard<std::mutex> lock(mutex_);
  Slot& slot = slots_[(id - 1) % slots_.size()];
  if (slot.id != id || slot.state != CollectiveState::kStarted) return false;
  slot.state = state;
  slot.end_unix_ms = end_unix_ms;
  if (start_unix_ms) *start_unix_ms = slot.call.start_unix_ms;
  return true;
}

std::vector<FlightRecorderEntry> FlightRecorderRing::entries() const {
  std::vector<FlightRecorderEntry> out;
  if (slots_.empty()) return out;
  std::lock_guard<std::mutex> lock(mutex_);
  const uint64_t newest = next_id_ - 1;
  const uint64_t held = std::min<uint64_t>(newest, slots_.size());
  out.reserve(held);
  for (uint64_t id = newest - held + 1; id <= newest; ++id) {
    const Slot& slot = slots_[(id - 1) % slots_.size()];
    out.push_back(to_entry(slot.call, slot.state, slot.end_unix_ms));
  }
  return out;
}

}  // namespace cpprun::detail
