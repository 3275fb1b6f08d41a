// The flight recorder: every process keeps its last N collectives (over all its process groups)
// in a ring buffer, and writes them as JSON when a collective fails or times out, when the
// launcher asks, and on std::terminate. The format and the environment variables:
// docs/faults_and_trust.md, "Flight recorder".
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace cpprun {

enum class CollectiveState { kStarted, kCompleted, kFailed };
const char* to_string(CollectiveState state);  // "started", "completed", "failed"

// One collective as this process issued it.
struct FlightRecorderEntry {
  std::string group;             // "0" for the first init_process_group's group; "0/sub1", ... for subgroups
  std::vector<int> group_ranks;  // the group's members as global ranks, in group rank order
  uint64_t seq = 0;              // the group's collective number (1, 2, ...); send/recv count apart
  std::string op;                // "all_reduce", "broadcast", "send", "recv", ...
  std::optional<std::string> dtype;           // "float32"; none for a barrier
  std::vector<std::vector<int64_t>> shapes;   // this rank's tensors (the output first where two)
  std::optional<std::string> reduce_op;       // "sum", "avg", "max", "min"
  std::optional<int> root;                    // broadcast, reduce, gather, scatter; send/recv: the peer
  std::optional<int> tag;                     // send/recv: the message's tag
  std::optional<std::string> label;           // send/recv: what the message carries, where the library
                                              // knows ("pipeline stage 1: the activation of micro-batch
                                              // 3 from stage 0")
  std::optional<std::string> public_call;     // the library's call it ran for ("cpprun::save_state_dict",
                                              // "DistributedDataParallel's backward"); none: the user's own
  CollectiveState state = CollectiveState::kStarted;
  int64_t start_unix_ms = 0;
  std::optional<int64_t> end_unix_ms;         // when it completed or failed
};

// The entries now in this process's flight recorder, oldest first (none when it is off:
// CPPRUN_FLIGHT_RECORDER_ENTRIES=0).
std::vector<FlightRecorderEntry> flight_recorder_entries();

// Writes the flight recorder as JSON (reason "request") to `path`, atomically (PATH.tmp, then a
// rename). Throws std::system_error naming the file when it cannot be written.
void dump_flight_recorder(const std::string& path);

}  // namespace cpprun
