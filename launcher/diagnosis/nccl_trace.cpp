// Naming PyTorch's NCCL flight-recorder dumps without reading them.
#include "diagnosis/nccl_trace.h"

#include <algorithm>
#include <filesystem>

#include "common/formatting.h"
#include "diagnosis/hang_diagnosis.h"
#include "support/json.h"

namespace cpprun::launcher {
namespace {

using detail::json_string;

// N of "rank_N" (up to 9 digits); -1 for any other name.
int rank_of(const std::string& name) {
  const std::string prefix = kNcclTraceFilePrefix;
  if (name.rfind(prefix, 0) != 0) return -1;
  const std::string digits = name.substr(prefix.size());
  if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::stoi(digits);
}

std::string size_text(std::uintmax_t bytes) {
  if (bytes < 10 * 1024) return std::to_string(bytes) + " B";
  if (bytes < 10 * 1024 * 1024) return std::to_string(bytes / 1024) + " KiB";
  return std::to_string(bytes / (1024 * 1024)) + " MiB";
}

}  // namespace

NcclTraceListing list_nccl_traces(const std::string& dir) noexcept {
  NcclTraceListing listing;
  try {
    listing.dir = dir;
    if (dir.empty()) return listing;
    namespace fs = std::filesystem;
    std::error_code error;
    fs::directory_iterator it(dir, error);
    if (error) {
      if (error != std::errc::no_such_file_or_directory) listing.error = error.message();
      return listing;
    }
    std::vector<NcclTraceFile> found;
    std::size_t scanned = 0;
    for (const fs::directory_iterator end; it != end; it.increment(error)) {
      if (error) break;
      if (++scanned > kNcclTraceScanLimit) {
        listing.error = "more than " + std::to_string(kNcclTraceScanLimit) + " entries; the rest not looked at";
        ++listing.unlisted;
        break;
      }
      std::error_code ignored;
      if (it->is_directory(ignored)) continue;  // nothing of PyTorch's; a worker's leftovers
      NcclTraceFile file;
      file.name = it->path().filename().string();
      file.rank = rank_of(file.name);
      if (file.name.size() > kNcclTraceNameLimit) file.name = file.name.substr(0, kNcclTraceNameLimit) + "...";
      const std::uintmax_t bytes = it->file_size(ignored);
      file.bytes = ignored ? 0 : bytes;
      found.push_back(std::move(file));
    }
    if (error && listing.error.empty()) listing.error = error.message();
    // rank_N by rank first (rank_-1 sorts as "other"), then other names.
    std::sort(found.begin(), found.end(), [](const NcclTraceFile& a, const NcclTraceFile& b) {
      if ((a.rank < 0) != (b.rank < 0)) return a.rank >= 0;
      return a.rank != b.rank ? a.rank < b.rank : a.name < b.name;
    });
    if (found.size() > kNcclTraceListLimit) {
      listing.unlisted += found.size() - kNcclTraceListLimit;
      found.resize(kNcclTraceListLimit);
    }
    listing.files = std::move(found);
  } catch (...) {  // bad_alloc or the like: the diagnosis goes on without these lines
    listing.files.clear();
    listing.error = "could not list the directory";
  }
  return listing;
}

std::string torchfrtrace_command(const std::string& dir) {
  return "torchfrtrace " + shell_quote(dir) + " -p " + kNcclTraceFilePrefix;
}

std::vector<std::string> nccl_trace_lines(const NcclTraceListing& listing) {
  std::vector<std::string> lines;
  if (listing.files.empty() && listing.unlisted == 0) {
    if (!listing.error.empty()) {
      lines.push_back("PyTorch's NCCL flight recorder: cannot read " + listing.dir + ": " + listing.error);
    }
    return lines;
  }
  std::vector<int> ranks;
  std::string names;
  for (const NcclTraceFile& f : listing.files) {
    if (f.rank >= 0) ranks.push_back(f.rank);
    names += (names.empty() ? "" : ", ") + f.name + " (" + size_text(f.bytes) + ")";
  }
  if (listing.unlisted != 0) names += " and " + std::to_string(listing.unlisted) + " more";
  const std::string who = ranks.empty()       ? "files"
                          : ranks.size() == 1 ? "rank " + rank_ranges(ranks) + " dumped its trace"
                                              : "ranks " + rank_ranges(ranks) + " dumped their traces";
  lines.push_back("PyTorch's NCCL flight recorder: " + who + " in " + listing.dir + ": " + names);
  if (!listing.error.empty()) lines.push_back("PyTorch's NCCL flight recorder: " + listing.error);
  lines.push_back("read them with PyTorch's reader (pickles; cpprun does not open them): " +
                  torchfrtrace_command(listing.dir));
  return lines;
}

std::string nccl_trace_json(const NcclTraceListing& listing) {
  std::string ranks;
  std::string files;
  for (const NcclTraceFile& f : listing.files) {
    if (f.rank >= 0) ranks += (ranks.empty() ? "" : ",") + std::to_string(f.rank);
    files += std::string(files.empty() ? "" : ",") + "{\"name\":" + json_string(f.name) +
             ",\"rank\":" + (f.rank >= 0 ? std::to_string(f.rank) : "null") + ",\"bytes\":" + std::to_string(f.bytes) +
             "}";
  }
  return "{\"dir\":" + json_string(listing.dir) + ",\"command\":" + json_string(torchfrtrace_command(listing.dir)) +
         ",\"ranks\":[" + ranks + "],\"files\":[" + files + "],\"unlisted\":" + std::to_string(listing.unlisted) +
         ",\"error\":" + json_string(listing.error) + "}";
}

}  // namespace cpprun::launcher
