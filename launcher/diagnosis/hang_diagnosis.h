// From every rank's flight-recorder dump (flight_dump.h) and what the launcher knows of each worker,
// the few lines that say which ranks are behind, where, and since when, e.g.
//   group world: rank 3 is in all_reduce #1042 (float32[4096], sum) since 612.0 s;
//   ranks 0-2 wait in all_gather #1043 (float32[1024]) since 20.5 s
// and the first collective on which ranks disagree. Pure: the caller gathers the dumps and prints.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "diagnosis/flight_dump.h"

namespace cpprun::launcher {

inline constexpr const char* kStillRunning = "still running";

struct RankEvidence {
  int rank = 0;
  std::optional<FlightDump> dump;
  std::string no_dump_reason;  // why there is no dump, when there is none
  std::string fate = kStillRunning;  // or "exited with code 1", "killed by SIGKILL (Killed)"
};

struct Diagnosis {
  std::vector<std::string> lines;  // for the console, without a prefix
  std::string json;                // the same, with each rank's last collective: for the log dir
};

// `why`: what led to it ("rank 1 exited with code 1", "SIGUSR1"), repeated in the JSON.
Diagnosis diagnose(const std::vector<RankEvidence>& ranks, const std::string& why);

// "0-2", "0, 2, 5-7": ranks sorted, runs joined.
std::string rank_ranges(std::vector<int> ranks);

}  // namespace cpprun::launcher
