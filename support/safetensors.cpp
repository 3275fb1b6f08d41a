// See safetensors.h. The checks follow the reference reader's (safetensors' Rust `validate`): a
// header that is one JSON object, offsets that tile the data section exactly.
#include "support/safetensors.h"

#include <algorithm>
#include <cstdio>
#include <memory>
#include <set>
#include <utility>

#include "cpprun/checkpoint_file.h"
#include "support/crc32.h"

namespace cpprun::detail {
namespace {

constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;  // the reference reader's limit
constexpr int kMaxJsonDepth = 8;                        // a header nests 3 deep

[[noreturn]] void bad(const std::string& path, const std::string& why) {
  throw CorruptCheckpointError("cpprun: safetensors file " + path + " is invalid: " + why +
                               ". Write it again, or use another file.");
}

// Just enough JSON for a header: objects, arrays, strings, numbers (kept as text).
struct Json {
  enum class Kind { kObject, kArray, kString, kNumber, kOther } kind = Kind::kOther;
  std::vector<std::pair<std::string, Json>> members;
  std::vector<Json> items;
  std::string text;
};

class JsonParser {
 public:
  JsonParser(std::string_view text, const std::string& path) : text_(text), path_(path) {}

  Json parse_document() {
    Json value = parse_value(0);
    skip_space();
    if (pos_ != text_.size()) fail("unexpected text after the JSON object");
    return value;
  }

 private:
  [[noreturn]] void fail(const std::string& what) {
    bad(path_, "its JSON header is malformed at byte " + std::to_string(pos_) + " of " +
                   std::to_string(text_.size()) + ": " + what);
  }
  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\n' || text_[pos_] == '\r' ||
                                   text_[pos_] == '\t')) {
      ++pos_;
    }
  }
  char peek() {
    skip_space();
    if (pos_ >= text_.size()) fail("it ends early");
    return text_[pos_];
  }
  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++pos_;
  }
  Json parse_value(int depth) {
    if (depth > kMaxJsonDepth) fail("nested too deeply");
    Json value;
    const char c = peek();
    if (c == '{') {
      value.kind = Json::Kind::kObject;
      ++pos_;
      std::set<std::string> seen;
      if (peek() == '}') {
        ++pos_;
        return value;
      }
      while (true) {
        if (peek() != '"') fail("expected a key");
        std::string key = parse_string();
        if (!seen.insert(key).second) fail("the key \"" + key + "\" appears twice");
        expect(':');
        value.members.emplace_back(std::move(key), parse_value(depth + 1));
        if (peek() == ',') {
          ++pos_;
          continue;
        }
        expect('}');
        return value;
      }
    }
    if (c == '[') {
      value.kind = Json::Kind::kArray;
      ++pos_;
      if (peek() == ']') {
        ++pos_;
        return value;
      }
      while (true) {
        value.items.push_back(parse_value(depth + 1));
        if (peek() == ',') {
          ++pos_;
          continue;
        }
        expect(']');
        return value;
      }
    }
    if (c == '"') {
      value.kind = Json::Kind::kString;
      value.text = parse_string();
      return value;
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
      value.kind = Json::Kind::kNumber;
      const std::size_t start = pos_;
      while (pos_ < text_.size() && std::string_view("+-.eE0123456789").find(text_[pos_]) != std::string_view::npos) {
        ++pos_;
      }
      value.text = std::string(text_.substr(start, pos_ - start));
      return value;
    }
    for (std::string_view word : {"true", "false", "null"}) {
      if (text_.substr(pos_, word.size()) == word) {
        pos_ += word.size();
        return value;
      }
    }
    fail(std::string("unexpected character '") + c + "'");
  }
  std::string parse_string() {
    expect('"');
    std::string out;
    while (true) {
      if (pos_ >= text_.size()) fail("a string is not closed");
      const char c = text_[pos_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("a control character inside a string");
      if (c != '\\') {
        out.push_back(c);
        continue;
      }
      if (pos_ >= text_.size()) fail("a string is not closed");
      const char e = text_[pos_++];
      switch (e) {
        case '"': case '\\': case '/': out.push_back(e); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        case 'u': out += parse_unicode_escape(); break;
        default: fail(std::string("unknown escape \\") + e);
      }
    }
  }
  unsigned hex4() {
    if (pos_ + 4 > text_.size()) fail("a \\u escape is cut short");
    unsigned value = 0;
    for (int i = 0; i < 4; ++i) {
      const char h = text_[pos_++];
      value <<= 4;
      if (h >= '0' && h <= '9') value |= h - '0';
      else if (h >= 'a' && h <= 'f') value |= h - 'a' + 10;
      else if (h >= 'A' && h <= 'F') value |= h - 'A' + 10;
      else fail("a \\u escape with a non-hex digit");
    }
    return value;
  }
  std::string parse_unicode_escape() {
    unsigned code = hex4();
    if (code >= 0xD800 && code < 0xDC00) {  // a surrogate pair
      if (text_.substr(pos_, 2) != "\\u") fail("a lone surrogate in a \\u escape");
      pos_ += 2;
      const unsigned low = hex4();
      if (low < 0xDC00 || low >= 0xE000) fail("a lone surrogate in a \\u escape");
      code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
    } else if (code >= 0xDC00 && code < 0xE000) {
      fail("a lone surrogate in a \\u escape");
    }
    std::string out;
    if (code < 0x80) {
      out.push_back(static_cast<char>(code));
    } else if (code < 0x800) {
      out.push_back(static_cast<char>(0xC0 | (code >> 6)));
      out.push_back(static_cast<char>(0x80 | (code & 0x3F)));
    } else if (code < 0x10000) {
      out.push_back(static_cast<char>(0xE0 | (code >> 12)));
      out.push_back(static_cast<char>(0x80 | ((code >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (code & 0x3F)));
    } else {
      out.push_back(static_cast<char>(0xF0 | (code >> 18)));
      out.push_back(static_cast<char>(0x80 | ((code >> 12) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | ((code >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (code & 0x3F)));
    }
    return out;
  }

  std::string_view text_;
  const std::string& path_;
  std::size_t pos_ = 0;
};

void append_json_string(std::string& out, std::string_view text) {
  out.push_back('"');
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(c);
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\u%04x", static_cast<unsigned>(c));
      out += escaped;
    } else {
      out.push_back(c);
    }
  }
  out.push_back('"');
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
  if (item_size == 0) bad(path, where + " has the unknown dtype \"" + tensor.dtype + "\"");
  if (shape->kind != Json::Kind::kArray) bad(path, where + "'s shape is not an array");
  // The element count, bounded by the data section so that it cannot overflow.
  std::uint64_t numel = 1;
  for (const Json& dim : shape->items) {
    const int64_t size = as_count(dim, path, where + "'s shape entry");
    tensor.shape.push_back(size);
    numel = (size == 0 || numel == 0) ? 0 : numel * static_cast<std::uint64_t>(size);
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
      {"BF16", 2}, {"I32", 4}, {"U32", 4}, {"F32", 4},     {"I64", 8},     {"U64", 8}, {"F64", 8}};
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
  const Json root = JsonParser(header, path).parse_document();
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
