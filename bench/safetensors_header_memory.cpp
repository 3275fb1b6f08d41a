// How much memory reading a safetensors file's header takes: a header of --mb MB (default 95, under
// the format's 100 MB limit) of tiny entries ("t123":{"dtype":"U8","shape":[1],"data_offsets":[..]},
// one data byte each), read by read_safetensors (the streaming parser, Note [Streaming safetensors
// header]) or, with --tree, parsed by the generic JSON tree it replaced (support/json.h). Prints one
// RESULT line: the header's bytes, its entries, and the process's peak resident memory over its size
// before the read (VmHWM after minus VmRSS before, the file's bytes already in memory; glibc's
// freed-but-kept pages count, as DESIGN.md says of RSS), in MB (1e6 bytes) and per header byte.
//   build/bench/safetensors_header_memory [--mb 95] [--tree]
// No LibTorch: built from the reader's few sources.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "bench/peak_rss.h"
#include "support/json.h"
#include "support/safetensors.h"

namespace {

int64_t rss() {
  std::FILE* status = std::fopen("/proc/self/status", "r");
  char line[256];
  long kb = 0;
  while (status && std::fgets(line, sizeof line, status)) {
    if (std::sscanf(line, "VmRSS: %ld kB", &kb) == 1) break;
  }
  if (status) std::fclose(status);
  return static_cast<int64_t>(kb) * 1024;
}

}  // namespace

int main(int argc, char** argv) {
  double mb = 95;
  bool tree = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--mb" && i + 1 < argc) mb = std::atof(argv[++i]);
    else if (arg == "--tree") tree = true;
    else {
      std::fprintf(stderr, "usage: %s [--mb 95] [--tree]\n", argv[0]);
      return 2;
    }
  }
  const std::size_t target = static_cast<std::size_t>(mb * 1e6);
  std::string header = "{";
  std::size_t entries = 0;
  while (header.size() + 80 < target) {
    if (entries) header += ",";
    header += "\"t" + std::to_string(entries) + "\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[" +
              std::to_string(entries) + "," + std::to_string(entries + 1) + "]}";
    ++entries;
  }
  header += "}";
  std::string bytes;
  bytes.reserve(8 + header.size() + entries);
  for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>((header.size() >> (8 * i)) & 0xFF));
  bytes += header;
  bytes.append(entries, 'x');
  header = std::string();  // only the file's bytes stay, as when a reader has read a file

  bench::reset_peak_rss();
  const int64_t before = rss();
  std::size_t read = 0;
  if (tree) {
    read = cpprun::detail::parse_json(std::string_view(bytes).substr(8, bytes.size() - 8 - entries), 8).members.size();
  } else {
    read = cpprun::detail::read_safetensors(bytes, "bench.safetensors").tensors.size();
  }
  const int64_t peak = bench::peak_rss() - before;
  const double header_bytes = static_cast<double>(bytes.size() - 8 - entries);
  std::printf("RESULT parser=%s header_mb=%.1f entries=%zu read=%zu peak_rss_growth_mb=%.1f per_header_byte=%.2f\n",
              tree ? "json_tree" : "streaming", header_bytes / 1e6, entries, read, peak / 1e6, peak / header_bytes);
  return read == entries ? 0 : 1;
}
