// See safetensors.h. The checks follow the reference reader's (safetensors' Rust `validate`): a
// header that is one JSON object, offsets that tile the data section exactly.
#include "support/safetensors.h"

#include <algorithm>
#include <cstdio>
#include <memory>
#include <utility>

#include "cpprun/checkpoint_file.h"
#include "support/crc32.h"
#include "support/json.h"

namespace cpprun::detail {
namespace {

constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;  // the reference reader's limit
constexpr int kMaxJsonDepth = 8;                        // a header nests 3 deep

[[noreturn]] void bad(const std::string& path, const std::string& why) {
  throw CorruptCheckpointError("cpprun: safetensors file " + path + " is invalid: " + why +
                               ". Write it again, or use another file.");
}

std::string hex8(std::uint32_t value) {
  char text[9];
  std::snprintf(text, sizeof text, "%08x", value);
  return text;
}

// A non-negative integer that fits int64, or a named error.
int64_t as_count(const Json& value, const std::string& path, const std::string& what) {
  const bool digits = value.kind == Json::Kind::kNumber && !value.text.empty() && value.text.size() <= 18 &&
                      value.text.find_first_not_of("0123456789") == std::string::npos;
  if (!digits) bad(path, what + " is not a non-negative integer");
  return std::stoll(value.text);
}

SafetensorsTensor parse_entry(const std::string& name, const Json& entry, std::uint64_t data_size,
                              std::vector<std::pair<int64_t, int64_t>>& ranges, const std::string& path) {
  const std::string where = "tensor \"" + name + "\"";
  if (entry.kind != Json::Kind::kObject) bad(path, where + " is not a JSON object");
  const Json* dtype = nullptr;
  const Json* shape = nullptr;
  const Json* offsets = nullptr;
  for (const auto& [key, value] : entry.members) {
    if (key == "dtype") dtype = &value;
    else if (key == "shape") shape = &value;
    else if (key == "data_offsets") offsets = &value;
    else bad(path, where + " has an unknown field \"" + key + "\"");
  }
  if (!dtype || !shape || !offsets) bad(path, where + " lacks one of dtype, shape, data_offsets");
  SafetensorsTensor tensor;
  tensor.name = name;
  if (dtype->kind != Json::Kind::kString) bad(path, where + "'s dtype is not a string");
  tensor.dtype = dtype->text;
  const std::size_t item_size = safetensors_dtype_size(tensor.dtype);
  if (item_size == 0 && (tensor.dtype == "F4" || tensor.dtype == "F6_E2M3" || tensor.dtype == "F6_E3M2")) {
    // A valid file, not a damaged one: say what cpprun lacks, not that the file is wrong.
    throw CorruptCheckpointError("cpprun: safetensors file " + path + ": " + where + " has dtype " + tensor.dtype +
                                 ", whose elements are smaller than a byte; cpprun reads whole-byte dtypes only. "
                                 "Convert it (in PyTorch, .to(torch.bfloat16)) and save it again.");
  }
  if (item_size == 0) bad(path, where + " has the dtype \"" + tensor.dtype + "\", which is not one safetensors defines");
  if (shape->kind != Json::Kind::kArray) bad(path, where + "'s shape is not an array");
  // The element count, bounded by the data section. The product of the dimensions other than 0
  // must fit int64 too (LibTorch multiplies every one of them to size a tensor, 0 or not).
  std::uint64_t numel = 1;
  std::int64_t nonzero_product = 1;
  for (const Json& dim : shape->items) {
    const int64_t size = as_count(dim, path, where + "'s shape entry");
    tensor.shape.push_back(size);
    if (size != 0 && __builtin_mul_overflow(nonzero_product, size, &nonzero_product)) {
      bad(path, where + "'s shape has more elements than a 64-bit count holds");
    }
    numel = (size == 0 || numel == 0) ? 0 : static_cast<std::uint64_t>(nonzero_product);
    if (numel > data_size) bad(path, where + "'s shape holds more elements than the file has bytes");
  }
  if (offsets->kind != Json::Kind::kArray || offsets->items.size() != 2) {
    bad(path, where + "'s data_offsets is not [begin, end]");
  }
  const int64_t begin = as_count(offsets->items[0], path, where + "'s data_offsets begin");
  const int64_t end = as_count(offsets->items[1], path, where + "'s data_offsets end");
  if (begin > end || static_cast<std::uint64_t>(end) > data_size) {
    bad(path, where + "'s data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                  "] lie outside the file's " + std::to_string(data_size) + " data bytes");
  }
  if (static_cast<std::uint64_t>(end - begin) != numel * item_size) {
    bad(path, where + " is " + tensor.dtype + " of " + std::to_string(numel) + " elements (" +
                  std::to_string(numel * item_size) + " bytes) but its data_offsets span " +
                  std::to_string(end - begin) + " bytes");
  }
  ranges.emplace_back(begin, end);
  return tensor;
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

std::string write_safetensors(std::vector<SafetensorsTensor> tensors, std::map<std::string, std::string> metadata) {
  std::sort(tensors.begin(), tensors.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  std::uint32_t crc = 0;
  for (const auto& t : tensors) crc = crc32(t.data, crc);
  metadata[std::string(kSafetensorsCrcKey)] = hex8(crc);

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
  std::uint64_t offset = 0;
  for (const auto& t : tensors) {
    header.push_back(',');
    append_json_string(header, t.name);
    header += ":{\"dtype\":\"" + t.dtype + "\",\"shape\":[";
    for (std::size_t i = 0; i < t.shape.size(); ++i) header += (i ? "," : "") + std::to_string(t.shape[i]);
    header += "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(offset + t.data.size()) + "]}";
    offset += t.data.size();
  }
  header.push_back('}');
  while (header.size() % 8 != 0) header.push_back(' ');  // the data starts 8-byte aligned

  std::string out;
  out.reserve(8 + header.size() + offset);
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((header.size() >> (8 * i)) & 0xFF));
  out += header;
  for (const auto& t : tensors) out.append(t.data);
  return out;
}

SafetensorsFile read_safetensors(std::string_view bytes, const std::string& path) {
  if (bytes.size() < 8) {
    bad(path, "it has " + std::to_string(bytes.size()) + " bytes, fewer than the 8 of the header length");
  }
  std::uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) header_size = header_size << 8 | static_cast<unsigned char>(bytes[i]);
  if (header_size > kMaxHeaderBytes) {
    bad(path, "its header length is " + std::to_string(header_size) + " bytes, more than the format's limit of " +
                  std::to_string(kMaxHeaderBytes));
  }
  if (header_size > bytes.size() - 8) {
    bad(path, "its header length is " + std::to_string(header_size) + " bytes but only " +
                  std::to_string(bytes.size() - 8) + " follow (cut short?)");
  }
  const std::string_view header = bytes.substr(8, header_size);
  if (header.empty() || header[0] != '{') bad(path, "its header does not start with '{'");
  Json root;
  try {
    root = parse_json(header, kMaxJsonDepth);
  } catch (const JsonSyntaxError& e) {
    bad(path, std::string("its JSON header is ") + e.what());
  }
  if (root.kind != Json::Kind::kObject) bad(path, "its header is not a JSON object");

  const std::string_view data = bytes.substr(8 + header_size);
  SafetensorsFile file;
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (const auto& [name, entry] : root.members) {
    if (name == "__metadata__") {
      if (entry.kind != Json::Kind::kObject) bad(path, "its __metadata__ is not a JSON object");
      for (const auto& [key, value] : entry.members) {
        if (value.kind != Json::Kind::kString) bad(path, "its __metadata__ value of \"" + key + "\" is not a string");
        file.metadata[key] = value.text;
      }
      continue;
    }
    file.tensors.push_back(parse_entry(name, entry, data.size(), ranges, path));
    file.tensors.back().data = data.substr(ranges.back().first, ranges.back().second - ranges.back().first);
  }
  // The ranges must tile [0, data size): no overlap, no hole, nothing after the last.
  std::sort(ranges.begin(), ranges.end());
  int64_t covered = 0;
  for (const auto& [begin, end] : ranges) {
    if (begin != covered) {
      bad(path, begin < covered ? "two tensors' data_offsets overlap at byte " + std::to_string(begin)
                                : "no tensor covers data bytes " + std::to_string(covered) + " to " +
                                      std::to_string(begin));
    }
    covered = end;
  }
  if (static_cast<std::uint64_t>(covered) != data.size()) {
    bad(path, "its tensors cover " + std::to_string(covered) + " data bytes but it holds " +
                  std::to_string(data.size()) + " (added to?)");
  }
  const auto recorded = file.metadata.find(std::string(kSafetensorsCrcKey));
  if (recorded != file.metadata.end()) {
    // Over the data in offset order, as the writer computed it.
    std::vector<const SafetensorsTensor*> ordered;
    for (const auto& t : file.tensors) ordered.push_back(&t);
    std::sort(ordered.begin(), ordered.end(),
              [](const auto* a, const auto* b) { return a->data.data() < b->data.data(); });
    std::uint32_t crc = 0;
    for (const auto* t : ordered) crc = crc32(t->data, crc);
    if (hex8(crc) != recorded->second) {
      throw CorruptCheckpointError("cpprun: safetensors file " + path + " is damaged: the CRC-32 of its " +
                                   std::to_string(data.size()) + " data bytes is 0x" + hex8(crc) + " but 0x" +
                                   recorded->second + " was recorded when it was written (its bytes changed since)."
                                   " It cannot be trusted: use an earlier checkpoint, or start afresh.");
    }
  }
  return file;
}

}  // namespace cpprun::detail
