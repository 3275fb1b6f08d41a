// The safetensors format (Hugging Face's; https://github.com/huggingface/safetensors), as bytes:
// an 8-byte little-endian header length N, N bytes of JSON ({"name": {"dtype": "F32", "shape":
// [2, 3], "data_offsets": [begin, end]}, ..., "__metadata__": {"key": "value"}}), then the tensors'
// raw little-endian data, offsets counted from the data's start. No LibTorch here: the reader's
// decisions are unit-tested on plain bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace cpprun::detail {

struct SafetensorsTensor {
  std::string name;
  std::string dtype;            // "F32", "BF16", "I64", ... (the format's names)
  std::vector<int64_t> shape;
  std::string_view data;        // shape's product x the dtype's size bytes
};

// Whether PATH's name ends in ".safetensors" (any case, as a model's save takes it) after at least
// one character: the name by which a save chooses this format.
bool has_safetensors_extension(std::string_view path);

// Bytes per element of a safetensors dtype; 0 for a name the format does not define.
std::size_t safetensors_dtype_size(std::string_view dtype);

// The longest header the reference reader takes.
inline constexpr std::uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

// The metadata key under which cpprun records the CRC-32 of the tensors' data taken in name order
// (8 hex digits; not of the data section as stored, which is in alignment order).
inline constexpr std::string_view kSafetensorsCrcKey = "cpprun_crc32";
// ... and the CRC-32 of the header's content (8 hex digits): the other metadata, and each tensor's
// name, dtype and shape, in name order (Note [The header's own CRC]).
inline constexpr std::string_view kSafetensorsHeaderCrcKey = "cpprun_header_crc32";

// The file's bytes: tensors stored back to back in the data's order (largest elements first, then
// by name, so that each starts aligned to its element size, as the reference writer's do),
// the header padded with spaces to a multiple of 8 bytes (as the reference writer does);
// `metadata` plus kSafetensorsCrcKey, the CRC-32 of the tensors' data in name order, and
// kSafetensorsHeaderCrcKey.
std::string write_safetensors(std::vector<SafetensorsTensor> tensors, std::map<std::string, std::string> metadata);

// A file's layout from its tensors' names, dtypes, shapes and sizes alone, before any data: for a
// file whose data several processes write in place (checkpoint/rows_in_place.h) and whose CRC is
// known last. The header records the CRC in 8 hex digits, so its length does not depend on it;
// header and data are then what write_safetensors writes for the same tensors, byte for byte.
struct SafetensorsEntry {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::uint64_t bytes = 0;  // the data's
};
struct SafetensorsLayout {
  std::vector<SafetensorsEntry> entries;       // the data's order: element size (largest first), then name
  std::vector<std::uint64_t> offsets;          // each entry's data, from the data's start
  std::map<std::string, std::string> metadata;  // without the two CRC keys
  std::uint64_t data_start = 0;                // the header length's 8 bytes and the header
  std::uint64_t data_bytes = 0;
};
SafetensorsLayout safetensors_layout(std::vector<SafetensorsEntry> entries, std::map<std::string, std::string> metadata);
// The file's first layout.data_start bytes, recording `data_crc`, the CRC-32 of the tensors' data
// in name order, and the header's own CRC.
std::string safetensors_header(const SafetensorsLayout& layout, std::uint32_t data_crc);

struct SafetensorsFile {
  std::vector<SafetensorsTensor> tensors;  // in the header's order; data views into the bytes read
  std::map<std::string, std::string> metadata;
};
// Reads `bytes` strictly (header length within the file and at most 100 MB, valid JSON, known
// dtypes, offsets in range, neither overlapping nor leaving holes, sizes matching the shapes) and
// verifies kSafetensorsCrcKey and kSafetensorsHeaderCrcKey when present. Throws
// cpprun::CorruptCheckpointError naming `path` and what is wrong.
SafetensorsFile read_safetensors(std::string_view bytes, const std::string& path);

// PATH's __metadata__ from its header alone (the file is mapped and the parser reads nothing past
// the header: no data is read, whatever the file's size); none when PATH cannot be opened or its
// header is not valid or its content fails kSafetensorsHeaderCrcKey (a load of the file then says
// what is wrong). Not checked: the data's CRC, the tiling of the data.
std::optional<std::map<std::string, std::string>> read_safetensors_metadata(const std::string& path);

}  // namespace cpprun::detail
