// Hugging Face's sharded safetensors layout, as names and text: a directory of
// model-00001-of-0000N.safetensors files and model.safetensors.index.json
// ({"metadata": {"total_size": BYTES}, "weight_map": {"tensor name": "file name"}}), the layout
// transformers' save_pretrained writes and from_pretrained reads. The decisions (which tensor goes
// to which file, whether an index and its files agree) are here, without LibTorch or I/O.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace cpprun::detail {

inline constexpr std::string_view kSafetensorsIndexName = "model.safetensors.index.json";
inline constexpr std::string_view kSafetensorsSingleName = "model.safetensors";
// The safetensors __metadata__ (and index metadata) keys of one save: every file of a save
// carries the same id; the step is the caller's, when given.
inline constexpr std::string_view kSaveIdKey = "cpprun_save_id";
inline constexpr std::string_view kStepKey = "cpprun_step";

// The stem of a model's files ("model-00001-of-00002.safetensors", "model.safetensors.index.json")
// and of an optimizer's saved beside them ("optimizer-...", "optimizer.safetensors.index.json").
inline constexpr std::string_view kModelStem = "model";
inline constexpr std::string_view kOptimizerStem = "optimizer";
// "STEM.safetensors.index.json" and "STEM.safetensors".
std::string index_file_name(std::string_view stem);
std::string single_file_name(std::string_view stem);

// "model-00002-of-00004.safetensors" for part 2 (1-based) of 4, as transformers names them.
std::string shard_file_name(int part, int parts, std::string_view stem = kModelStem);
// Whether `name` has that form (a file an earlier sharded save may have left).
bool is_shard_file_name(std::string_view name, std::string_view stem = kModelStem);

// Splits tensors (in state-dict order, `bytes` each) into min(parts, tensors) contiguous runs,
// each tensor whole in one run (as transformers shards, by order), the largest run as small as
// possible. Returns each tensor's run, 0-based, in order, none empty.
std::vector<int> partition_by_bytes(const std::vector<std::uint64_t>& bytes, int parts);

struct SafetensorsIndex {
  std::map<std::string, std::string> metadata;  // "total_size" (digits), kSaveIdKey, kStepKey, ...
  std::map<std::string, std::string> weight_map;  // tensor name -> file name in the same directory
};

std::string write_safetensors_index(const SafetensorsIndex& index);
// The largest index read. An index names each tensor's file once, a few MB at most for the largest
// models published; its JSON is parsed into a generic tree of some 15 bytes per byte, so a larger
// file (a hostile or mistaken one: the reader is handed whatever the directory holds) is refused
// rather than parsed into gigabytes.
inline constexpr std::size_t kMaxSafetensorsIndexBytes = std::size_t{64} << 20;
// Reads an index strictly: one JSON object with a "weight_map" object of strings (file names
// without a directory part); "metadata" optional, its values strings or numbers (kept as text).
// Throws cpprun::CorruptCheckpointError naming `path` and what is wrong.
SafetensorsIndex read_safetensors_index(std::string_view text, const std::string& path);

// What one shard file holds, for checking it against the index.
struct ShardFileContents {
  std::string file;                 // its name in the directory
  std::vector<std::string> tensors;  // its tensors' names
  std::string save_id;              // its kSaveIdKey, "" when it has none (a file Python wrote)
};

// The faults of a sharded directory, one line each (empty: it is whole): a tensor the index
// places in a file that lacks it; a tensor a file holds that the index places elsewhere or not at
// all; files whose save id differs from the index's (or, when the index has none, from most
// files'), each named with its id: a directory mixing two saves.
std::vector<std::string> sharded_directory_faults(const SafetensorsIndex& index,
                                                  const std::vector<ShardFileContents>& files);

}  // namespace cpprun::detail
