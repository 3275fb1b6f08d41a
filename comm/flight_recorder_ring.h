// The flight recorder's ring buffer: the last `capacity` collectives of this process, each
// recorded when issued and updated when it completes or fails. Process-wide state, dumps and
// triggers live in comm/flight_recorder.h; this is the data structure alone, for unit tests.
#pragma once

#include <c10/core/ScalarType.h>
#include <c10/util/SmallVector.h>

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "cpprun/collectives.h"
#include "cpprun/flight_recorder.h"

namespace cpprun::detail {

// What every entry of one group shares: made once per group, held by its entries.
struct RecordedGroup {
  std::string name;
  std::vector<int> ranks;  // global ranks, in group rank order
};

// One collective as recorded when it is issued. Built by the caller outside the ring's lock;
// shapes of up to 6 dims stay inline (no allocation per collective).
struct RecordedCall {
  static constexpr std::size_t kMaxTensors = 2;
  std::shared_ptr<const RecordedGroup> group;
  uint64_t seq = 0;
  const char* op = "";                       // a string literal
  std::optional<at::ScalarType> dtype;
  uint8_t tensor_count = 0;
  std::array<c10::SmallVector<int64_t, 6>, kMaxTensors> shapes;
  std::optional<ReduceOp> reduce;
  std::optional<int> root;
  std::optional<int> tag;            // send/recv
  std::optional<std::string> label;  // send/recv, when the sender or receiver said what it carries
  const char* public_call = nullptr;  // a string literal: Note [The public call of a collective]
  int64_t start_unix_ms = 0;
};

class FlightRecorderRing {
 public:
  // capacity 0: records nothing, start() returns 0.
  explicit FlightRecorderRing(std::size_t capacity);
  FlightRecorderRing(const FlightRecorderRing&) = delete;
  FlightRecorderRing& operator=(const FlightRecorderRing&) = delete;

  std::size_t capacity() const { return slots_.size(); }
  bool enabled() const { return !slots_.empty(); }

  // Records `call` as started, overwriting the oldest entry when full. Returns the entry's id
  // (never 0), which finish() takes.
  uint64_t start(RecordedCall&& call);
  // Marks entry `id` completed or failed at `end_unix_ms`. False when it was already finished,
  // or has been overwritten since (then nothing changes). `start_unix_ms`, when given, receives
  // the entry's start time.
  bool finish(uint64_t id, CollectiveState state, int64_t end_unix_ms, int64_t* start_unix_ms = nullptr);
  // The entries now held, oldest first.
  std::vector<FlightRecorderEntry> entries() const;

 private:
  struct Slot {
    uint64_t id = 0;  // 0: never used
    RecordedCall call;
    CollectiveState state = CollectiveState::kStarted;
    int64_t end_unix_ms = 0;
  };
  mutable std::mutex mutex_;
  std::vector<Slot> slots_;
  uint64_t next_id_ = 1;  // id n lives in slot (n - 1) % capacity
};

}  // namespace cpprun::detail
