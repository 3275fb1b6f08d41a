// See safetensors_header.h.
//
// Note [Streaming safetensors header]
// The header (checked to be UTF-8 first, as the reference reader does) is read through JsonLexer
// (the generic parser's tokens, so the same texts are accepted and escapes decode alike) twice:
// once to count the entries and their names' bytes, so that arrays are allocated once (growing
// one by doubling held the old and new arrays together), then into the entries, each checked when
// it closes and kept as a SafetensorsTensor when valid. Beside the result only one entry's fields
// are kept; the generic tree kept a Json of ~100 bytes per value, its strings and a set of each
// object's keys: 15-24 times a header of tiny entries (docs/checkpoints.md has the measurements).
// Which fault a header with several gets is the tree's too: a fault of the JSON (syntax, depth, a
// key twice in an object, text after it) wins over one of the content, and of those the first in
// the header's order. So content faults are held until the text has been read to its end, and
// repeated tensor names are found by sorting the names once at the end (or at a syntax fault, for
// the ones before it) rather than by a set or hash table as they come: O(n log n) whatever the
// names, where a hash table's probes could be made quadratic by chosen names. Once a content fault
// is held, no entry is kept, only the names, back to back in one string with a 4-byte offset each
// (keeping every entry to the end cost 22 times a header of "":0 entries); where the repeated
// name ended is found again by a third reading, only when there is one.
// Differences, to keep nothing of values that are wrong anyway: inside an unknown field, a field
// or a __metadata__ value of the wrong kind, keys repeated in a nested object, and unknown fields
// repeated in an entry, are not looked for; the wrong value is named instead. Past
// kMaxMetadataKeys, __metadata__'s keys are neither kept nor checked for repeats.
#include "support/safetensors_header.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "cpprun/checkpoint_file.h"
#include "support/json_lexer.h"

namespace cpprun::detail {
namespace {

constexpr int kMaxHeaderDepth = 8;  // a header nests 3 deep; the generic parser's bound before
// The most dimensions a shape may have: LibTorch's own bound for the dims of a reduction
// (at::dim_bitset_size, ATen/WrapDimUtilsMulti.h), and what keeps a shape of 0s from costing 4
// times its text. The reference reader has none.
constexpr std::size_t kMaxShapeDims = 64;
// The most __metadata__ keys: each costs a std::map node of ~100 bytes for as few as 8 bytes of
// text ("123":"",); writers store a handful. The reference reader has none.
constexpr std::size_t kMaxMetadataKeys = 65536;
// The shortest valid entry with its comma, "":{"dtype":"U8","shape":[0],"data_offsets":[0,0]},
// bounds how many tensors a header of N bytes can hold.
constexpr std::size_t kShortestEntry = 50;
// A name, key or dtype as a message shows it: a JSON string (control characters escaped, so none
// reaches a terminal or log raw; the header is valid UTF-8), its first ~200 bytes only.
constexpr std::size_t kShownBytes = 200;

std::string shown_json(std::string_view text) {
  if (text.size() <= kShownBytes) return json_string(text);
  std::size_t cut = kShownBytes;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;  // whole characters
  return json_string(text.substr(0, cut)) + "... (" + std::to_string(text.size()) + " bytes)";
}

std::string repeated_key(std::string_view key) { return "the key " + shown_json(key) + " appears twice"; }

// The first byte where `text` stops being UTF-8 as Rust's str::from_utf8 defines it (the
// reference reader's first check): no overlong forms, no surrogates, nothing past U+10FFFF, no
// sequence cut short; nothing when it is all valid.
std::optional<std::size_t> first_invalid_utf8(std::string_view text) {
  const auto byte = [&](std::size_t i) { return i < text.size() ? static_cast<unsigned char>(text[i]) : 0u; };
  std::size_t i = 0;
  while (i < text.size()) {
    const unsigned c = byte(i);
    if (c < 0x80) {
      ++i;
      continue;
    }
    std::size_t length = 0;
    unsigned low = 0x80, high = 0xBF;  // the second byte's range
    if (c >= 0xC2 && c <= 0xDF) length = 2;
    else if (c == 0xE0) length = 3, low = 0xA0;
    else if (c == 0xED) length = 3, high = 0x9F;  // not U+D800..U+DFFF
    else if (c >= 0xE1 && c <= 0xEF) length = 3;
    else if (c == 0xF0) length = 4, low = 0x90;
    else if (c == 0xF4) length = 4, high = 0x8F;  // not past U+10FFFF
    else if (c >= 0xF1 && c <= 0xF3) length = 4;
    else return i;  // 0x80..0xC1 (a continuation, or overlong), 0xF5..0xFF
    if (byte(i + 1) < low || byte(i + 1) > high) return i;
    for (std::size_t k = 2; k < length; ++k) {
      if (byte(i + k) < 0x80 || byte(i + k) > 0xBF) return i;
    }
    i += length;
  }
  return std::nullopt;
}

// A shape entry's or offset's value: a non-negative integer, that fits int64 (LibTorch's sizes)
// or is too large for it, or not an integer at all.
struct Count {
  enum class Kind { kValue, kTooLarge, kNotCount } kind = Kind::kNotCount;
  int64_t value = 0;
};
Count count_of(std::string_view number) {
  if (number.empty() || number.find_first_not_of("0123456789") != std::string_view::npos) return {};
  if (number.size() > 1 && number[0] == '0') return {};  // JSON refused it already
  int64_t value = 0;
  for (const char c : number) {
    if (__builtin_mul_overflow(value, 10, &value) || __builtin_add_overflow(value, c - '0', &value)) {
      return {Count::Kind::kTooLarge, 0};
    }
  }
  return {Count::Kind::kValue, value};
}

// A value read for its syntax alone (one that is wrong already, or inside one), as the generic
// parser would have parsed it, at `depth`; strings are decoded into `scratch`.
void skip_value(JsonLexer& lex, int depth, std::string& scratch) {
  if (depth > kMaxHeaderDepth) lex.fail("nested too deeply");
  const char c = lex.peek();
  if (c == '{' || c == '[') {
    const char close = c == '{' ? '}' : ']';
    lex.advance();
    if (lex.peek() == close) {
      lex.advance();
      return;
    }
    while (true) {
      if (c == '{') {
        if (lex.peek() != '"') lex.fail("expected a key");
        lex.read_string(scratch);
        lex.expect(':');
      }
      skip_value(lex, depth + 1, scratch);
      if (lex.peek() == ',') {
        lex.advance();
        continue;
      }
      lex.expect(close);
      return;
    }
  }
  if (c == '"') return lex.read_string(scratch);
  if (JsonLexer::starts_number(c)) {
    lex.read_number();
    return;
  }
  if (lex.read_word().empty()) lex.fail("unexpected character " + JsonLexer::shown(c));
}

// How many tensor entries the header has and their names' decoded bytes (up to a syntax fault,
// which the real reading reports); with `stop_at`, where the stop_at-th tensor's name ended.
struct EntryCount {
  std::size_t entries = 0, name_bytes = 0, name_end = 0;
};
EntryCount count_entries(std::string_view header, std::optional<std::size_t> stop_at = std::nullopt) {
  JsonLexer lex(header);
  std::string scratch;
  EntryCount count;
  try {
    lex.expect('{');
    if (lex.peek() == '}') return count;
    while (true) {
      if (lex.peek() != '"') return count;
      lex.read_string(scratch);
      if (scratch != "__metadata__") {
        if (stop_at == count.entries) {
          count.name_end = lex.pos();
          return count;
        }
        ++count.entries;
        count.name_bytes += scratch.size();
      }
      lex.expect(':');
      skip_value(lex, 1, scratch);
      if (lex.peek() != ',') return count;
      lex.advance();
    }
  } catch (const JsonSyntaxError&) {
    return count;
  }
}

// One entry's fields as read, checked once the entry closes, in the order the tree's reader checked them.
struct EntryFields {
  bool has_dtype = false, has_shape = false, has_offsets = false;
  std::optional<std::string> unknown;  // the first field that is none of the three
  bool dtype_is_string = false;
  std::string dtype;
  bool shape_is_array = false;
  std::vector<int64_t> dims;  // the shape's first kMaxShapeDims entries up to the first that is not a count
  std::size_t dims_count = 0;  // the shape's entries, all of them
  std::optional<Count::Kind> shape_non_count;  // why the first entry that stopped `dims` did
  bool offsets_is_array = false;
  std::size_t offsets_count = 0;
  Count offsets[2];

  void reset() {
    has_dtype = has_shape = has_offsets = dtype_is_string = shape_is_array = offsets_is_array = false;
    unknown.reset();
    dtype.clear();
    dims.clear();
    dims_count = 0;
    shape_non_count.reset();
    offsets_count = 0;
    offsets[0] = offsets[1] = Count{};
  }
};

class HeaderReader {
 public:
  HeaderReader(std::string_view header, std::string_view data, const std::string& path)
      : header_(header), data_(data), path_(path), lex_(header) {}

  SafetensorsFile read() {
    counted_ = count_entries(header_);
    // Only valid entries are kept (see Note [Streaming safetensors header]), so no more than the
    // shortest valid entry allows.
    file_.tensors.reserve(std::min(counted_.entries, header_.size() / kShortestEntry + 1));
    fields_.dims.reserve(kMaxShapeDims);
    try {
      read_root();
    } catch (const JsonSyntaxError&) {
      throw_first_repeat(lex_.pos());  // a repeated name before the fault was the tree's error
      throw;
    }
    throw_first_repeat(header_.size());
    if (held_) throw CorruptCheckpointError(*held_);
    return std::move(file_);
  }

 private:
  void read_root() {
    lex_.expect('{');
    if (lex_.peek() == '}') {
      lex_.advance();
    } else {
      while (true) {
        if (lex_.peek() != '"') lex_.fail("expected a key");
        lex_.read_string(entry_.name);
        reading_tensor_ = entry_.name != "__metadata__";
        if (!reading_tensor_) {
          if (seen_metadata_) lex_.fail(repeated_key(entry_.name));
          seen_metadata_ = true;
          lex_.expect(':');
          read_metadata();
        } else {
          if (held_) {
            names_.push_back(static_cast<std::uint32_t>(arena_.size()));
            arena_ += entry_.name;
          }
          lex_.expect(':');
          read_entry();
        }
        if (lex_.peek() == ',') {
          lex_.advance();
          continue;
        }
        lex_.expect('}');
        break;
      }
    }
    lex_.skip_space();
    if (!lex_.at_end()) lex_.fail("unexpected text after the JSON value");
  }

  // Holds the first content fault (the tree's reader reported it after the whole text parsed),
  // and from then on keeps only the tensors' names, for the repeats a JSON fault names.
  void hold(std::string message) {
    if (held_) return;
    held_ = std::move(message);
    // The tensors' array is let go before the names' one is made: both at once would double the peak.
    arena_.reserve(counted_.name_bytes);
    std::vector<std::uint32_t> kept(file_.tensors.size());
    for (std::size_t i = 0; i < kept.size(); ++i) {
      kept[i] = static_cast<std::uint32_t>(arena_.size());
      arena_ += file_.tensors[i].name;
    }
    std::vector<SafetensorsTensor>().swap(file_.tensors);
    names_.reserve(counted_.entries);
    names_.assign(kept.begin(), kept.end());
    if (reading_tensor_) {  // the faulty entry's
      names_.push_back(static_cast<std::uint32_t>(arena_.size()));
      arena_ += entry_.name;
    }
  }
  void fault(const std::string& why) { hold(invalid_safetensors_message(path_, why)); }

  void read_metadata() {
    if (lex_.peek() == 'n' && lex_.read_word() == "null") return;  // serde's Option: no metadata
    if (lex_.peek() != '{') {
      if (!held_) fault("its __metadata__ is not a JSON object");
      skip_value(lex_, 1, skipped_);
      return;
    }
    lex_.advance();
    if (lex_.peek() == '}') {
      lex_.advance();
      return;
    }
    while (true) {
      if (lex_.peek() != '"') lex_.fail("expected a key");
      lex_.read_string(key_);
      if (file_.metadata.size() >= kMaxMetadataKeys) {
        // Past the bound nothing is kept (nor looked for: a key repeated there is not named).
        if (!held_) {
          fault("its __metadata__ has more than " + std::to_string(kMaxMetadataKeys) +
                " keys, the most cpprun reads");
        }
        lex_.expect(':');
        skip_value(lex_, 2, skipped_);
      } else {
        const auto [entry, added] = file_.metadata.try_emplace(std::move(key_));
        if (!added) lex_.fail(repeated_key(entry->first));
        lex_.expect(':');
        if (lex_.peek() == '"') {
          lex_.read_string(entry->second);
        } else {
          if (!held_) fault("its __metadata__ value of " + shown_json(entry->first) + " is not a string");
          skip_value(lex_, 2, skipped_);
        }
      }
      if (lex_.peek() == ',') {
        lex_.advance();
        continue;
      }
      lex_.expect('}');
      return;
    }
  }

  void read_entry() {
    if (lex_.peek() != '{') {
      if (!held_) fault("tensor " + shown_json(entry_.name) + " is not a JSON object");
      skip_value(lex_, 1, skipped_);
      return;
    }
    lex_.advance();
    fields_.reset();
    if (lex_.peek() == '}') {
      lex_.advance();
    } else {
      while (true) {
        if (lex_.peek() != '"') lex_.fail("expected a key");
        lex_.read_string(key_);
        if (key_ == "dtype") {
          if (fields_.has_dtype) lex_.fail(repeated_key(key_));
          fields_.has_dtype = true;
          lex_.expect(':');
          fields_.dtype_is_string = lex_.peek() == '"';
          if (fields_.dtype_is_string) lex_.read_string(fields_.dtype);
          else skip_value(lex_, 2, skipped_);
        } else if (key_ == "shape") {
          if (fields_.has_shape) lex_.fail(repeated_key(key_));
          fields_.has_shape = true;
          lex_.expect(':');
          read_shape();
        } else if (key_ == "data_offsets") {
          if (fields_.has_offsets) lex_.fail(repeated_key(key_));
          fields_.has_offsets = true;
          lex_.expect(':');
          read_offsets();
        } else {
          if (!fields_.unknown) fields_.unknown = std::move(key_);
          lex_.expect(':');
          skip_value(lex_, 2, skipped_);
        }
        if (lex_.peek() == ',') {
          lex_.advance();
          continue;
        }
        lex_.expect('}');
        break;
      }
    }
    if (held_) return;
    check_entry();
    if (held_) return;
    file_.tensors.push_back(std::move(entry_));
    entry_ = SafetensorsTensor();
  }

  void read_shape() {
    fields_.shape_is_array = lex_.peek() == '[';
    if (!fields_.shape_is_array) return skip_value(lex_, 2, skipped_);
    read_counts([&](Count dim) {
      ++fields_.dims_count;
      if (fields_.shape_non_count || fields_.dims.size() == kMaxShapeDims) return;
      if (dim.kind == Count::Kind::kValue) fields_.dims.push_back(dim.value);
      else fields_.shape_non_count = dim.kind;
    });
  }
  void read_offsets() {
    fields_.offsets_is_array = lex_.peek() == '[';
    if (!fields_.offsets_is_array) return skip_value(lex_, 2, skipped_);
    read_counts([&](Count offset) {
      if (fields_.offsets_count < 2) fields_.offsets[fields_.offsets_count] = offset;
      ++fields_.offsets_count;
    });
  }
  // An array (at depth 2) of counts, each given to `take` as it is read (kNotCount when not one).
  template <typename Take>
  void read_counts(Take take) {
    lex_.advance();  // '['
    if (lex_.peek() == ']') {
      lex_.advance();
      return;
    }
    while (true) {
      if (JsonLexer::starts_number(lex_.peek())) {
        take(count_of(lex_.read_number()));
      } else {
        skip_value(lex_, 3, skipped_);
        take(Count{});
      }
      if (lex_.peek() == ',') {
        lex_.advance();
        continue;
      }
      lex_.expect(']');
      return;
    }
  }

  // The tree reader's checks of one entry, in its order; the first fault is held.
  void check_entry() {
    const auto where = [&] { return "tensor " + shown_json(entry_.name); };
    const EntryFields& f = fields_;
    if (f.unknown) return fault(where() + " has an unknown field " + shown_json(*f.unknown));
    if (!f.has_dtype || !f.has_shape || !f.has_offsets) return fault(where() + " lacks one of dtype, shape, data_offsets");
    if (!f.dtype_is_string) return fault(where() + "'s dtype is not a string");
    const std::size_t item_size = safetensors_dtype_size(f.dtype);
    if (item_size == 0 && (f.dtype == "F4" || f.dtype == "F6_E2M3" || f.dtype == "F6_E3M2")) {
      // A valid file, not a damaged one: say what cpprun lacks, not that the file is wrong.
      return hold("cpprun: safetensors file " + path_ + ": " + where() + " has dtype " + f.dtype +
                  ", whose elements are smaller than a byte; cpprun reads whole-byte dtypes only. "
                  "Convert it (in PyTorch, .to(torch.bfloat16)) and save it again.");
    }
    if (item_size == 0) return fault(where() + " has the dtype " + shown_json(f.dtype) + ", which is not one safetensors defines");
    if (!f.shape_is_array) return fault(where() + "'s shape is not an array");
    if (f.dims_count > kMaxShapeDims) {
      return fault(where() + "'s shape has " + std::to_string(f.dims_count) + " dimensions, more than the " +
                   std::to_string(kMaxShapeDims) + " LibTorch's reductions take");
    }
    // The element count, bounded by the data section. The product of the dimensions other than 0
    // must fit int64 too (LibTorch multiplies every one of them to size a tensor, 0 or not).
    const std::uint64_t data_size = data_.size();
    std::uint64_t numel = 1;
    std::int64_t nonzero_product = 1;
    for (const int64_t size : f.dims) {
      if (size != 0 && __builtin_mul_overflow(nonzero_product, size, &nonzero_product)) {
        return fault(where() + "'s shape has more elements than a 64-bit count holds");
      }
      numel = (size == 0 || numel == 0) ? 0 : static_cast<std::uint64_t>(nonzero_product);
      if (numel > data_size) return fault(where() + "'s shape holds more elements than the file has bytes");
    }
    if (f.shape_non_count == Count::Kind::kTooLarge) {
      return fault(where() + "'s shape entry is larger than LibTorch's sizes (int64) hold");
    }
    if (f.shape_non_count) return fault(where() + "'s shape entry is not a non-negative integer");
    if (!f.offsets_is_array || f.offsets_count != 2) return fault(where() + "'s data_offsets is not [begin, end]");
    for (int i = 0; i < 2; ++i) {
      const char* which = i == 0 ? "begin" : "end";
      if (f.offsets[i].kind == Count::Kind::kTooLarge) {
        return fault(where() + "'s data_offsets " + which + " lies outside the file's " + std::to_string(data_size) +
                     " data bytes");
      }
      if (f.offsets[i].kind != Count::Kind::kValue) {
        return fault(where() + "'s data_offsets " + which + " is not a non-negative integer");
      }
    }
    const int64_t begin = f.offsets[0].value, end = f.offsets[1].value;
    if (begin > end || static_cast<std::uint64_t>(end) > data_size) {
      return fault(where() + "'s data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                   "] lie outside the file's " + std::to_string(data_size) + " data bytes");
    }
    if (static_cast<std::uint64_t>(end - begin) != numel * item_size) {
      return fault(where() + " is " + f.dtype + " of " + std::to_string(numel) + " elements (" +
                   std::to_string(numel * item_size) + " bytes) but its data_offsets span " +
                   std::to_string(end - begin) + " bytes");
    }
    entry_.dtype = f.dtype;
    // Copied at its size: `dims` keeps its capacity of kMaxShapeDims for the next entry.
    entry_.shape.assign(f.dims.begin(), f.dims.end());
    entry_.data = data_.substr(begin, end - begin);
  }

  std::string malformed_at(std::size_t at, const std::string& why) const {
    return "malformed at byte " + std::to_string(at) + " of " + std::to_string(header_.size()) + ": " + why;
  }

  // Throws the tree's error for the first name (in the text) that repeats an earlier one, when it
  // ended at or before `limit` (where a syntax fault was found, or the end).
  void throw_first_repeat(std::size_t limit) {
    if (held_) {
      throw_first_repeat(names_.size(), limit, [&](std::size_t i) {
        const std::size_t end = i + 1 < names_.size() ? names_[i + 1] : arena_.size();
        return std::string_view(arena_).substr(names_[i], end - names_[i]);
      });
    } else {
      throw_first_repeat(file_.tensors.size(), limit, [&](std::size_t i) { return std::string_view(file_.tensors[i].name); });
    }
  }
  template <typename NameOf>
  void throw_first_repeat(std::size_t count, std::size_t limit, NameOf name_of) {
    if (count < 2) return;
    std::vector<std::uint32_t> order(count);
    for (std::uint32_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](std::uint32_t a, std::uint32_t b) {
      const int c = name_of(a).compare(name_of(b));
      return c != 0 ? c < 0 : a < b;
    });
    std::optional<std::uint32_t> first;  // the repeating tensor that comes first
    for (std::size_t i = 1; i < order.size(); ++i) {
      // order[i] repeats order[i - 1]'s name; the earliest of a run of equal names is its first.
      if (name_of(order[i]) == name_of(order[i - 1]) && (i < 2 || name_of(order[i - 1]) != name_of(order[i - 2])) &&
          (!first || order[i] < *first)) {
        first = order[i];
      }
    }
    if (!first) return;
    // Where its name ended, found again rather than kept for every name.
    const std::size_t end = count_entries(header_, *first).name_end;
    if (end > limit) return;
    throw JsonSyntaxError(malformed_at(end, repeated_key(name_of(*first))));
  }

  std::string_view header_, data_;
  const std::string& path_;
  JsonLexer lex_;
  EntryCount counted_;
  SafetensorsFile file_;
  SafetensorsTensor entry_;  // the entry being read, kept in file_ when valid
  bool reading_tensor_ = false;  // entry_ is a tensor's, not __metadata__
  bool seen_metadata_ = false;
  std::optional<std::string> held_;  // the first content fault's message
  // Once a fault is held: every tensor's name (the valid ones' before it too), back to back in
  // arena_, each starting at names_[i].
  std::string arena_;
  std::vector<std::uint32_t> names_;
  EntryFields fields_;
  std::string key_, skipped_;  // reused: a key as read, a skipped string
};

}  // namespace

std::string invalid_safetensors_message(const std::string& path, const std::string& why) {
  return "cpprun: safetensors file " + path + " is invalid: " + why + ". Write it again, or use another file.";
}

SafetensorsFile parse_safetensors_header(std::string_view header, std::string_view data, const std::string& path) {
  if (const auto at = first_invalid_utf8(header)) {
    throw CorruptCheckpointError(invalid_safetensors_message(
        path, "its header is not UTF-8 (byte " + std::to_string(*at) + " of " + std::to_string(header.size()) + ")"));
  }
  try {
    return HeaderReader(header, data, path).read();
  } catch (const JsonSyntaxError& e) {
    throw CorruptCheckpointError(invalid_safetensors_message(path, std::string("its JSON header is ") + e.what()));
  }
}

}  // namespace cpprun::detail
