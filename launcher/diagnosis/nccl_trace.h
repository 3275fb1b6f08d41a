// PyTorch's own NCCL flight-recorder dumps in a diagnosis (issue 27): the files a failed or timed-out
// job's ranks left in the attempt's nccl_flight_recorder/ directory (workers/nccl_trace_env.h), named
// with the command of PyTorch's that reads them (torchfrtrace). cpprun never opens them: they are
// pickles, PyTorch's to read. Listing is bounded (files, names, entries scanned) and never throws, so
// that directory cannot break a diagnosis; the lines and JSON are pure.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace cpprun::launcher {

// The dump prefix's two names: this LibTorch reads TORCH_FR_ first, older ones TORCH_NCCL_ only.
// workers/nccl_trace_env.h sets them for each worker.
inline constexpr const char* kNcclTraceFileVariables[] = {"TORCH_FR_DUMP_TEMP_FILE",
                                                          "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"};
// What follows `dir` in the prefix: the files are DIR/rank_0, DIR/rank_1, ... (torchfrtrace DIR -p rank_).
inline constexpr const char* kNcclTraceFilePrefix = "rank_";

// At most this many files are named; the rest are counted.
inline constexpr std::size_t kNcclTraceListLimit = 16;
// At most this many directory entries are looked at.
inline constexpr std::size_t kNcclTraceScanLimit = 4096;
// A longer file name is cut to this many bytes, with "...".
inline constexpr std::size_t kNcclTraceNameLimit = 96;

struct NcclTraceFile {
  std::string name;        // as found (cut if long)
  int rank = -1;           // N of rank_N; -1: some other file
  std::uintmax_t bytes = 0;
};

struct NcclTraceListing {
  std::string dir;
  std::vector<NcclTraceFile> files;  // rank_N files by rank, then the others by name
  std::size_t unlisted = 0;          // further files (and entries not scanned)
  std::string error;                 // why the directory was not read in full; "" if it was
};

// The files in `dir` ("" or missing: none). Never throws.
NcclTraceListing list_nccl_traces(const std::string& dir) noexcept;

// "torchfrtrace DIR -p rank_", DIR quoted for a shell where needed.
std::string torchfrtrace_command(const std::string& dir);

// The diagnosis's lines for them, without a prefix; none when there are no files (and no error).
std::vector<std::string> nccl_trace_lines(const NcclTraceListing& listing);

// diagnosis.json's "nccl_trace" object: dir, command, ranks, files (name, rank, bytes), unlisted, error.
std::string nccl_trace_json(const NcclTraceListing& listing);

}  // namespace cpprun::launcher
