// One rank's flight-recorder dump, as the library writes it (docs/faults_and_trust.md, "Flight
// recorder"): the last collectives the rank started, oldest first. Read by the launcher to say which
// rank is where when a job fails or hangs (hang_diagnosis.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace cpprun::launcher {

struct CollectiveRecord {
  enum class State { kStarted, kCompleted, kFailed };
  std::string group;             // the process group's name
  std::vector<int> group_ranks;  // its members' global ranks; empty: every rank
  int64_t seq = 0;               // the group's sequence number of this collective
  std::string op;                // "all_reduce", "broadcast", ...
  std::string dtype;             // "float32", ...
  std::string shapes;            // "[4096]", "[4096], [2, 3]": as the messages print them
  std::string reduce_op;         // "sum", ...; "" when the op has none
  std::optional<int> root;       // send/recv: the peer (none: any source)
  std::optional<int> tag;        // send/recv
  std::string label;             // send/recv: what it carries, when the library said ("pipeline stage 1: ..."); cut
                                 // to kMaxLabelBytes, control characters as '?'
  std::string public_call;       // the library's call it ran for ("cpprun::save_state_dict"); "" when none or
                                 // the user's own; cut and cleaned as the label
  State state = State::kStarted;
  int64_t start_unix_ms = 0;
  std::optional<int64_t> end_unix_ms;

  // "all_reduce #1042 (float32[4096], sum)": what ranks must agree on.
  std::string call() const;
  // call() as ranks' calls are compared: an all_to_all's without its shapes, which differ from
  // rank to rank when its splits do (an uneven all-to-all is one call; the library compares only
  // its dtype and device: CollectiveCall::shapes_vary in comm/collective_fingerprint.h).
  std::string compared() const;
  // call(), then " in DistributedDataParallel's backward" when it ran for a library call: for messages.
  std::string describe() const;
};

// The longest label (or op, group, dtype, reduce op, reason) read from a dump: the library's are a
// line; a longer one is cut, not refused. Each is cleaned of control characters as '?'.
inline constexpr std::size_t kMaxLabelBytes = 200;

struct FlightDump {
  int rank = -1;
  int world_size = 0;
  int64_t pid = 0;
  int64_t dumped_unix_ms = 0;
  std::string reason;  // "timeout", "failure", "request", "terminate"
  std::vector<CollectiveRecord> entries;
};

// The dump in `json`, checked: its format tag and version, and every field's type. Throws
// std::runtime_error naming what is wrong.
FlightDump parse_flight_dump(const std::string& json);

// The dump at `path`, or nullopt with `error` set (missing, too large, unreadable or invalid).
std::optional<FlightDump> read_flight_dump(const std::string& path, std::string& error);

}  // namespace cpprun::launcher
