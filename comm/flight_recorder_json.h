// The flight recorder's file format: one JSON document per rank (docs/faults_and_trust.md,
// "Flight recorder"). A pure function, so the format has unit tests without processes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cpprun/flight_recorder.h"
#include "cpprun/launcher_contract.h"

namespace cpprun::detail {

// Why a dump was written.
enum class DumpReason { kTimeout, kFailure, kRequest, kTerminate, kExit };
const char* to_string(DumpReason reason);  // "timeout", "failure", "request", "terminate"

struct DumpHeader {
  int rank = 0;        // global rank
  int world_size = 1;
  int64_t pid = 0;
  int64_t dumped_unix_ms = 0;
  DumpReason reason = DumpReason::kRequest;
};

constexpr int kFlightRecorderFormatVersion = contract::kFlightDumpFormatVersion;  // what the launcher reads

// {"format":"cpprun-flight-recorder","version":1,"rank":..,...,"entries":[...]}: `entries`
// oldest first, one per line.
std::string flight_recorder_json(const DumpHeader& header, const std::vector<FlightRecorderEntry>& entries);

}  // namespace cpprun::detail
