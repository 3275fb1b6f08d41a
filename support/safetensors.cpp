// See safetensors.h. The checks follow the reference reader's (safetensors' Rust `validate`): a
// header that is one JSON object, offsets that tile the data section exactly. The header's JSON is
// read by safetensors_header.cpp, with no generic tree (Note [Streaming safetensors header]).
#include "support/safetensors.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <memory>
#include <optional>
#include <utility>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cpprun/checkpoint_file.h"
#include "support/crc32.h"
#include "support/json.h"
#include "support/safetensors_header.h"

namespace cpprun::detail {
namespace {


[[noreturn]] void bad(const std::string& path, const std::string& why) {
  throw CorruptCheckpointError(invalid_safetensors_message(path, why));
}

std::string hex8(std::uint32_t value) {
  char text[9];
  std::snprintf(text, sizeof text, "%08x", value);
  return text;
}

// Note [The header's own CRC]
// cpprun_crc32 covers the data only, and the header carries what a load acts on as much as the
// data: an optimizer's learning rates and step, a save id, each tensor's shape. One byte changed
// there (lr "0.01" to "0.09") loaded silently (an audit, 2026-12-07). So the header's content has
// a CRC of its own: the metadata but the two CRCs, by key, then each tensor's name, dtype and shape
// by name, each field ended by a 0 byte. Not the header's bytes: a file rewritten by the reference
// writer with the same tensors and metadata (another order, another spacing) keeps it true.
template <typename Described>  // SafetensorsEntry or SafetensorsTensor: name, dtype, shape
std::uint32_t header_content_crc(const std::map<std::string, std::string>& metadata,
                                 const std::vector<Described>& tensors) {
  std::string content;
  for (const auto& [key, value] : metadata) {
    if (key == kSafetensorsCrcKey || key == kSafetensorsHeaderCrcKey) continue;
    content.append(key).push_back('\0');
    content.append(value).push_back('\0');
  }
  std::vector<const Described*> by_name;
  for (const auto& t : tensors) by_name.push_back(&t);
  std::sort(by_name.begin(), by_name.end(), [](const auto* a, const auto* b) { return a->name < b->name; });
  for (const Described* t : by_name) {
    content.append(t->name).push_back('\0');
    content.append(t->dtype).push_back('\0');
    for (std::size_t d = 0; d < t->shape.size(); ++d) content += (d ? "," : "") + std::to_string(t->shape[d]);
    content.push_back('\0');
  }
  return crc32(content);
}

// The CRC the file's header content has, when the file records another (8 hex digits); nothing
// when it records none or the right one.
std::optional<std::string> header_crc_mismatch(const SafetensorsFile& file) {
  const auto recorded = file.metadata.find(std::string(kSafetensorsHeaderCrcKey));
  if (recorded == file.metadata.end()) return std::nullopt;
  std::string computed = hex8(header_content_crc(file.metadata, file.tensors));
  if (computed == recorded->second) return std::nullopt;
  return computed;
}

}  // namespace

std::size_t safetensors_dtype_size(std::string_view dtype) {
  static const std::map<std::string_view, std::size_t> sizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"I16", 2}, {"U16", 2}, {"F16", 2},
      {"BF16", 2}, {"I32", 4}, {"U32", 4}, {"F32", 4},     {"I64", 8},     {"U64", 8}, {"F64", 8},
      {"F8_E4M3FNUZ", 1}, {"F8_E5M2FNUZ", 1}, {"F8_E8M0", 1}, {"C64", 8}};
  const auto found = sizes.find(dtype);
  return found == sizes.end() ? 0 : found->second;
}

// Note [Data in alignment order]
// The data section starts 8-byte aligned, and a reader that maps the file (safetensors' safe_open,
// torch.frombuffer) hands out each tensor where it lies. Stored by name, a bf16 tensor of odd
// length left the float32 or float64 tensors after it misaligned: PyTorch read them through its
// unaligned paths, slower, and its float64 sums of them rounded otherwise in the last bit (an
// interop test's bit-for-bit comparison found it, 2026-12-07). The reference writer groups by
// dtype (its enum's order, largest first); this one orders by element size, largest first, then
// by name, and every tensor starts at a multiple of its element size. The CRC stays over the
// tensors in name order (Note [The CRC is over the tensors in name order]).
bool in_data_order(const SafetensorsEntry& a, const SafetensorsEntry& b) {
  const std::size_t size_a = safetensors_dtype_size(a.dtype), size_b = safetensors_dtype_size(b.dtype);
  return size_a != size_b ? size_a > size_b : a.name < b.name;
}

SafetensorsLayout safetensors_layout(std::vector<SafetensorsEntry> entries, std::map<std::string, std::string> metadata) {
  std::sort(entries.begin(), entries.end(), in_data_order);
  SafetensorsLayout layout;
  metadata.erase(std::string(kSafetensorsCrcKey));
  metadata.erase(std::string(kSafetensorsHeaderCrcKey));
  layout.metadata = std::move(metadata);
  for (const auto& e : entries) {
    layout.offsets.push_back(layout.data_bytes);
    layout.data_bytes += e.bytes;
  }
  layout.entries = std::move(entries);
  layout.data_start = safetensors_header(layout, 0).size();  // the CRC's digits are always 8
  return layout;
}

std::string safetensors_header(const SafetensorsLayout& layout, std::uint32_t data_crc) {
  std::map<std::string, std::string> metadata = layout.metadata;
  metadata[std::string(kSafetensorsHeaderCrcKey)] = hex8(header_content_crc(metadata, layout.entries));
  metadata[std::string(kSafetensorsCrcKey)] = hex8(data_crc);
  std::string header = "{\"__metadata__\":{";
  bool first = true;
  for (const auto& [key, value] : metadata) {
    if (!first) header.push_back(',');
    first = false;
    append_json_string(header, key);
    header.push_back(':');
    append_json_string(header, value);
  }
  header.push_back('}');
  for (std::size_t i = 0; i < layout.entries.size(); ++i) {
    const SafetensorsEntry& t = layout.entries[i];
    header.push_back(',');
    append_json_string(header, t.name);
    header += ":{\"dtype\":\"" + t.dtype + "\",\"shape\":[";
    for (std::size_t d = 0; d < t.shape.size(); ++d) header += (d ? "," : "") + std::to_string(t.shape[d]);
    header += "],\"data_offsets\":[" + std::to_string(layout.offsets[i]) + "," +
              std::to_string(layout.offsets[i] + t.bytes) + "]}";
  }
  header.push_back('}');
  while (header.size() % 8 != 0) header.push_back(' ');  // the data starts 8-byte aligned
  std::string out;
  out.reserve(8 + header.size());
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((header.size() >> (8 * i)) & 0xFF));
  return out + header;
}

std::string write_safetensors(std::vector<SafetensorsTensor> tensors, std::map<std::string, std::string> metadata) {
  std::sort(tensors.begin(), tensors.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  std::uint32_t crc = 0;  // in name order
  std::vector<SafetensorsEntry> entries;
  entries.reserve(tensors.size());
  std::map<std::string_view, std::string_view> data_of;
  for (const auto& t : tensors) {
    crc = crc32(t.data, crc);
    entries.push_back({t.name, t.dtype, t.shape, t.data.size()});
    data_of[t.name] = t.data;
  }
  const SafetensorsLayout layout = safetensors_layout(std::move(entries), std::move(metadata));
  std::string out = safetensors_header(layout, crc);
  out.reserve(layout.data_start + layout.data_bytes);
  for (const auto& e : layout.entries) out.append(data_of.at(e.name));  // in the data's order
  return out;
}

namespace {

// The header and the data section of a file's bytes, checked as the reference reader checks them
// before it parses the header.
std::pair<std::string_view, std::string_view> split_safetensors(std::string_view bytes, const std::string& path) {
  if (bytes.size() < 8) {
    bad(path, "it has " + std::to_string(bytes.size()) + " bytes, fewer than the 8 of the header length");
  }
  std::uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) header_size = header_size << 8 | static_cast<unsigned char>(bytes[i]);
  if (header_size > kMaxSafetensorsHeaderBytes) {
    bad(path, "its header length is " + std::to_string(header_size) + " bytes, more than the format's limit of " +
                  std::to_string(kMaxSafetensorsHeaderBytes));
  }
  if (header_size > bytes.size() - 8) {
    bad(path, "its header length is " + std::to_string(header_size) + " bytes but only " +
                  std::to_string(bytes.size() - 8) + " follow (cut short?)");
  }
  const std::string_view header = bytes.substr(8, header_size);
  // JSON white space may come first: serde_json, the reference reader's parser, skips it.
  const std::size_t first = header.find_first_not_of(" \t\n\r");
  if (first == std::string_view::npos || header[first] != '{') bad(path, "its header does not start with '{'");
  return {header, bytes.substr(8 + header_size)};
}

}  // namespace

bool has_safetensors_extension(std::string_view path) {
  constexpr std::string_view ext = ".safetensors";
  if (path.size() <= ext.size()) return false;
  const std::string_view tail = path.substr(path.size() - ext.size());
  return std::equal(tail.begin(), tail.end(), ext.begin(),
                    [](char a, char b) { return std::tolower(static_cast<unsigned char>(a)) == b; });
}

std::optional<std::map<std::string, std::string>> read_safetensors_metadata(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  struct stat st {};
  void* mapped = MAP_FAILED;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
    mapped = ::mmap(nullptr, static_cast<std::size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
  }
  ::close(fd);
  if (mapped == MAP_FAILED) return std::nullopt;
  const std::string_view bytes(static_cast<const char*>(mapped), static_cast<std::size_t>(st.st_size));
  std::optional<std::map<std::string, std::string>> metadata;
  try {
    const auto [header, data] = split_safetensors(bytes, path);
    SafetensorsFile parsed = parse_safetensors_header(header, data, path);  // reads no data
    if (!header_crc_mismatch(parsed)) metadata = std::move(parsed.metadata);
  } catch (const CorruptCheckpointError&) {
    metadata.reset();
  }
  ::munmap(mapped, static_cast<std::size_t>(st.st_size));
  return metadata;
}

SafetensorsFile read_safetensors(std::string_view bytes, const std::string& path) {
  const auto [header, data] = split_safetensors(bytes, path);
  SafetensorsFile file = parse_safetensors_header(header, data, path);

  // The ranges must tile [0, data size): no overlap, no hole, nothing after the last. In offset
  // order (ties by end).
  std::vector<const SafetensorsTensor*> ordered;
  ordered.reserve(file.tensors.size());
  for (const auto& t : file.tensors) ordered.push_back(&t);
  std::sort(ordered.begin(), ordered.end(), [](const auto* a, const auto* b) {
    return a->data.data() != b->data.data() ? a->data.data() < b->data.data() : a->data.size() < b->data.size();
  });
  int64_t covered = 0;
  for (const auto* t : ordered) {
    const int64_t begin = t->data.data() - data.data();
    if (begin != covered) {
      bad(path, begin < covered ? "two tensors' data_offsets overlap at byte " + std::to_string(begin)
                                : "no tensor covers data bytes " + std::to_string(covered) + " to " +
                                      std::to_string(begin));
    }
    covered = begin + static_cast<int64_t>(t->data.size());
  }
  if (static_cast<std::uint64_t>(covered) != data.size()) {
    bad(path, "its tensors cover " + std::to_string(covered) + " data bytes but it holds " +
                  std::to_string(data.size()) + " (added to?)");
  }
  // Note [The CRC is over the tensors in name order]
  // cpprun records the CRC-32 of a file's tensors' data in name order (the data itself lies in
  // alignment order: Note [Data in alignment order]). It is checked in name order too, whatever
  // order the file holds them in: a file rewritten with the same tensors in another order (the
  // reference writer's save_file(tensors, metadata=f.metadata()) orders them by dtype first) keeps
  // the metadata, and its tensors are the same bytes; it was once refused as damaged. The file's
  // own order is accepted as well, which is what scripts/dcp_convert.py stamped on the reference
  // writer's files before it used name order.
  const auto recorded = file.metadata.find(std::string(kSafetensorsCrcKey));
  if (recorded != file.metadata.end()) {
    std::uint32_t in_file_order = 0;
    for (const auto* t : ordered) in_file_order = crc32(t->data, in_file_order);
    std::vector<const SafetensorsTensor*> by_name(ordered);
    std::sort(by_name.begin(), by_name.end(), [](const auto* a, const auto* b) { return a->name < b->name; });
    std::uint32_t in_name_order = 0;
    if (by_name != ordered) {
      for (const auto* t : by_name) in_name_order = crc32(t->data, in_name_order);
    } else {
      in_name_order = in_file_order;
    }
    if (hex8(in_name_order) != recorded->second && hex8(in_file_order) != recorded->second) {
      throw CorruptCheckpointError(
          "cpprun: safetensors file " + path + " is damaged: the CRC-32 of its " + std::to_string(data.size()) +
          " data bytes (its tensors in name order) is 0x" + hex8(in_name_order) + " but 0x" + recorded->second +
          " was recorded when cpprun wrote it (its tensors' bytes changed since). It cannot be trusted: use an "
          "earlier checkpoint, or start afresh. If its tensors were changed on purpose and cpprun's metadata kept, "
          "drop the \"" + std::string(kSafetensorsCrcKey) + "\" key from the metadata.");
    }
  }
  // See Note [The header's own CRC].
  if (const auto computed = header_crc_mismatch(file)) {
    throw CorruptCheckpointError(
        "cpprun: safetensors file " + path + " is damaged: the CRC-32 of its header's content (its metadata, "
        "and its tensors' names, dtypes and shapes) is 0x" + *computed + " but 0x" +
        file.metadata.at(std::string(kSafetensorsHeaderCrcKey)) +
        " was recorded when cpprun wrote it (a setting it holds, such as an optimizer's learning rate or step, "
        "or a tensor's shape, changed since). It cannot be trusted: use an earlier checkpoint, or start afresh. "
        "If the header was changed on purpose, drop the \"" + std::string(kSafetensorsHeaderCrcKey) +
        "\" key from the metadata.");
  }
  return file;
}

}  // namespace cpprun::detail
