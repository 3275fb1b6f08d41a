// What the launcher (cpprun) and the library agree on, written once: the variables the launcher
// gives the workers, and the files the library writes there for the launcher to read. LibTorch-free,
// like env_lookup.h beside it, because the launcher links no LibTorch and includes only these two
// headers of the library's. A change to a file's layout here changes its version.
#pragma once

#include <string>

namespace cpprun::contract {

// ---- The flight recorder: comm/flight_recorder.h writes the dumps, the launcher's
// diagnosis/flight_dump.h reads them, and workers/flight_requests.h asks for them.

// The directory the launcher gives each worker for its dumps (per attempt, unless the user set it).
inline constexpr const char* kFlightRecorderDirVariable = "CPPRUN_FLIGHT_RECORDER_DIR";
// The worker's end of the launcher's socket pair: a byte on it asks for a dump.
inline constexpr const char* kFlightRecorderRequestFdVariable = "CPPRUN_FLIGHT_RECORDER_REQUEST_FD";
// A dump's "format" and "version": {"format":"cpprun-flight-recorder","version":1,"rank":..}.
// A key added later is optional to its readers (an entry's "tag" and "label", which dumps of
// before 2026-12 lack) and a reader ignores keys it does not know, so adding one keeps the version;
// a change that an older reader would misread changes it.
inline constexpr const char* kFlightDumpFormat = "cpprun-flight-recorder";
inline constexpr int kFlightDumpFormatVersion = 1;

// Rank R's dump in that directory: rank_R.json (written through rank_R.json.tmp).
inline std::string flight_dump_file_name(int rank) { return "rank_" + std::to_string(rank) + ".json"; }
// Left beside the dumps by a rank that answers requests, so the launcher waits only for those.
inline std::string flight_listening_file_name(int rank) { return "rank_" + std::to_string(rank) + ".listening"; }

// ---- The error file: torch's @record format, which support/record.cpp (cpprun::record) writes and
// the launcher's failure summary and workers/error_file.h read:
//   {"message": {"message": "TYPE: WHAT", "extraInfo": {"py_callstack": ..., "timestamp": "SECONDS"}}}

// Where the worker writes it (the launcher gives each worker its own, per attempt).
inline constexpr const char* kErrorFileVariable = "TORCHELASTIC_ERROR_FILE";
inline constexpr const char* kErrorFileMessageKey = "message";      // the outer object, and its text
inline constexpr const char* kErrorFileExtraInfoKey = "extraInfo";
inline constexpr const char* kErrorFileCallstackKey = "py_callstack";
inline constexpr const char* kErrorFileTimestampKey = "timestamp";
// cpprun's own, beside torch's whole seconds (which torch's readers keep reading): the Unix time in
// milliseconds when the error was reported, before anything slow (the flight recorder's dump, the
// process's exit). Of several ranks that fail together the launcher names the one that reported
// first as the root cause, not the one whose process happened to end first.
inline constexpr const char* kErrorFileFailedAtMsKey = "cpprun_failed_at_ms";
// Set by the launcher in the copy it hands on (torch's ErrorHandler.dump_error_file does the same).
inline constexpr const char* kErrorFileCodeKey = "errorCode";

// ---- The workers' store in a multi-node job: reached through the agents' link (the launcher's
// rendezvous/store_tunnel_io.h), MASTER_ADDR is then the loopback on every node. Set to "1" then,
// so that the library does not take a loopback MASTER_ADDR to mean that every rank is on this host
// (comm/process_group.cpp's gloo_device).
inline constexpr const char* kStoreTunnelVariable = "CPPRUN_STORE_TUNNELLED";

}  // namespace cpprun::contract
