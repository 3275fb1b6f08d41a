// See safetensors_header.h.
//
// Note [Streaming safetensors header]
// The header is read through JsonLexer (the generic parser's tokens, so the same texts are accepted
// and escapes decode alike) twice: once to count the entries, so that the result is allocated once
// (growing it by doubling held the old and new arrays together), then into the entries, each
// checked when it closes and kept as a SafetensorsTensor. Beside the result only one entry's fields
// and 4 bytes per tensor (where its name ended, for the error about a repeated name) are kept; the
// generic tree kept a Json of ~100 bytes per value, its strings and a set of each object's keys:
// 15-24 times a header of tiny entries (docs/checkpoints.md has the measurement).
// Which fault a header with several gets is the tree's too: a fault of the JSON (syntax, depth, a
// key twice in an object, text after it) wins over one of the content, and of those the first in
// the header's order. So content faults are held until the text has been read to its end, and
// repeated tensor names are found by sorting the names once at the end (or at a syntax fault, for
// the ones before it) rather than by a set or hash table as they come: O(n log n) whatever the
// names, where a hash table's probes could be made quadratic by chosen names.
// One difference, to keep nothing of values that are wrong anyway: inside an unknown field, a field
// or a __metadata__ value of the wrong kind, keys repeated in a nested object, and unknown fields
// repeated in an entry, are not looked for; the wrong value is named instead.
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

std::string repeated_key(const std::string& key) { return "the key \"" + key + "\" appears twice"; }

// A shape entry's or offset's value: a non-negative integer that fits int64 (18 digits at most),
// else nothing, for the caller to name the field.
std::optional<int64_t> count_of(std::string_view number) {
  if (number.empty() || number.size() > 18 || number.find_first_not_of("0123456789") != std::string_view::npos) {
    return std::nullopt;
  }
  int64_t value = 0;
  for (const char c : number) value = value * 10 + (c - '0');
  return value;
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
  if (lex.read_word().empty()) lex.fail(std::string("unexpected character '") + c + "'");
}

// How many tensor entries the header has (up to a syntax fault, which the real reading reports):
// see Note [Streaming safetensors header].
std::size_t count_entries(std::string_view header) {
  JsonLexer lex(header);
  std::string scratch;
  std::size_t count = 0;
  try {
    lex.expect('{');
    if (lex.peek() == '}') return 0;
    while (true) {
      if (lex.peek() != '"') return count;
      lex.read_string(scratch);
      count += scratch != "__metadata__";
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
  std::vector<int64_t> dims;  // the shape's entries up to the first that is not a count
  bool shape_has_non_count = false;
  bool offsets_is_array = false;
  std::size_t offsets_count = 0;
  std::optional<int64_t> offsets[2];

  void reset() {
    has_dtype = has_shape = has_offsets = dtype_is_string = shape_is_array = shape_has_non_count = false;
    offsets_is_array = false;
    unknown.reset();
    dtype.clear();
    dims.clear();
    offsets_count = 0;
    offsets[0].reset();
    offsets[1].reset();
  }
};

class HeaderReader {
 public:
  HeaderReader(std::string_view header, std::string_view data, const std::string& path)
      : header_(header), data_(data), path_(path), lex_(header) {}

  SafetensorsFile read() {
    const std::size_t entries = count_entries(header_);
    file_.tensors.reserve(entries);
    name_ends_.reserve(entries);
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
        lex_.read_string(key_);
        if (key_ == "__metadata__") {
          if (seen_metadata_) lex_.fail(repeated_key(key_));
          seen_metadata_ = true;
          lex_.expect(':');
          read_metadata();
        } else {
          file_.tensors.emplace_back().name = key_;
          name_ends_.push_back(static_cast<std::uint32_t>(lex_.pos()));
          lex_.expect(':');
          read_entry(file_.tensors.back());
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

  // Holds the first content fault (the tree's reader reported it after the whole text parsed).
  void hold(std::string message) {
    if (!held_) held_ = std::move(message);
  }
  void fault(const std::string& why) { hold(invalid_safetensors_message(path_, why)); }

  void read_metadata() {
    if (lex_.peek() != '{') {
      fault("its __metadata__ is not a JSON object");
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
      const auto [entry, added] = file_.metadata.try_emplace(key_);
      if (!added) lex_.fail(repeated_key(key_));
      lex_.expect(':');
      if (lex_.peek() == '"') {
        lex_.read_string(entry->second);
      } else {
        fault("its __metadata__ value of \"" + entry->first + "\" is not a string");
        skip_value(lex_, 2, skipped_);
      }
      if (lex_.peek() == ',') {
        lex_.advance();
        continue;
      }
      lex_.expect('}');
      return;
    }
  }

  void read_entry(SafetensorsTensor& tensor) {
    if (lex_.peek() != '{') {
      fault("tensor \"" + tensor.name + "\" is not a JSON object");
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
          if (!fields_.unknown) fields_.unknown = key_;
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
    if (!held_) check_entry(tensor);
  }

  void read_shape() {
    fields_.shape_is_array = lex_.peek() == '[';
    if (!fields_.shape_is_array) return skip_value(lex_, 2, skipped_);
    read_counts([&](std::optional<int64_t> dim) {
      if (fields_.shape_has_non_count) return;
      if (dim) fields_.dims.push_back(*dim);
      else fields_.shape_has_non_count = true;
    });
  }
  void read_offsets() {
    fields_.offsets_is_array = lex_.peek() == '[';
    if (!fields_.offsets_is_array) return skip_value(lex_, 2, skipped_);
    read_counts([&](std::optional<int64_t> offset) {
      if (fields_.offsets_count < 2) fields_.offsets[fields_.offsets_count] = offset;
      ++fields_.offsets_count;
    });
  }
  // An array (at depth 2) of counts, each given to `take` as it is read (nothing when not a count).
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
        take(std::nullopt);
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
  void check_entry(SafetensorsTensor& tensor) {
    const std::string where = "tensor \"" + tensor.name + "\"";
    const EntryFields& f = fields_;
    if (f.unknown) return fault(where + " has an unknown field \"" + *f.unknown + "\"");
    if (!f.has_dtype || !f.has_shape || !f.has_offsets) return fault(where + " lacks one of dtype, shape, data_offsets");
    if (!f.dtype_is_string) return fault(where + "'s dtype is not a string");
    const std::size_t item_size = safetensors_dtype_size(f.dtype);
    if (item_size == 0 && (f.dtype == "F4" || f.dtype == "F6_E2M3" || f.dtype == "F6_E3M2")) {
      // A valid file, not a damaged one: say what cpprun lacks, not that the file is wrong.
      return hold("cpprun: safetensors file " + path_ + ": " + where + " has dtype " + f.dtype +
                  ", whose elements are smaller than a byte; cpprun reads whole-byte dtypes only. "
                  "Convert it (in PyTorch, .to(torch.bfloat16)) and save it again.");
    }
    if (item_size == 0) return fault(where + " has the dtype \"" + f.dtype + "\", which is not one safetensors defines");
    if (!f.shape_is_array) return fault(where + "'s shape is not an array");
    // The element count, bounded by the data section. The product of the dimensions other than 0
    // must fit int64 too (LibTorch multiplies every one of them to size a tensor, 0 or not).
    const std::uint64_t data_size = data_.size();
    std::uint64_t numel = 1;
    std::int64_t nonzero_product = 1;
    for (const int64_t size : f.dims) {
      if (size != 0 && __builtin_mul_overflow(nonzero_product, size, &nonzero_product)) {
        return fault(where + "'s shape has more elements than a 64-bit count holds");
      }
      numel = (size == 0 || numel == 0) ? 0 : static_cast<std::uint64_t>(nonzero_product);
      if (numel > data_size) return fault(where + "'s shape holds more elements than the file has bytes");
    }
    if (f.shape_has_non_count) return fault(where + "'s shape entry is not a non-negative integer");
    if (!f.offsets_is_array || f.offsets_count != 2) return fault(where + "'s data_offsets is not [begin, end]");
    if (!f.offsets[0]) return fault(where + "'s data_offsets begin is not a non-negative integer");
    if (!f.offsets[1]) return fault(where + "'s data_offsets end is not a non-negative integer");
    const int64_t begin = *f.offsets[0], end = *f.offsets[1];
    if (begin > end || static_cast<std::uint64_t>(end) > data_size) {
      return fault(where + "'s data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                   "] lie outside the file's " + std::to_string(data_size) + " data bytes");
    }
    if (static_cast<std::uint64_t>(end - begin) != numel * item_size) {
      return fault(where + " is " + f.dtype + " of " + std::to_string(numel) + " elements (" +
                   std::to_string(numel * item_size) + " bytes) but its data_offsets span " +
                   std::to_string(end - begin) + " bytes");
    }
    tensor.dtype = f.dtype;
    tensor.shape.assign(f.dims.begin(), f.dims.end());  // exactly its size: no spare capacity per tensor
    tensor.data = data_.substr(begin, end - begin);
  }

  // Throws the tree's error for the first name (in the text) that repeats an earlier one, when it
  // ended at or before `limit` (where a syntax fault was found, or the end).
  void throw_first_repeat(std::size_t limit) {
    const auto& tensors = file_.tensors;
    if (tensors.size() < 2) return;
    std::vector<std::uint32_t> order(tensors.size());
    for (std::uint32_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](std::uint32_t a, std::uint32_t b) {
      const int c = tensors[a].name.compare(tensors[b].name);
      return c != 0 ? c < 0 : a < b;
    });
    std::optional<std::uint32_t> first;  // the repeating tensor that ends first
    for (std::size_t i = 1; i < order.size(); ++i) {
      // order[i] repeats order[i - 1]'s name; the earliest of a run of equal names is its first.
      if (tensors[order[i]].name == tensors[order[i - 1]].name &&
          (i < 2 || tensors[order[i - 1]].name != tensors[order[i - 2]].name) && (!first || order[i] < *first)) {
        first = order[i];
      }
    }
    if (!first || name_ends_[*first] > limit) return;
    throw JsonSyntaxError("malformed at byte " + std::to_string(name_ends_[*first]) + " of " +
                          std::to_string(header_.size()) + ": " + repeated_key(tensors[*first].name));
  }

  std::string_view header_, data_;
  const std::string& path_;
  JsonLexer lex_;
  SafetensorsFile file_;
  std::vector<std::uint32_t> name_ends_;  // per tensor, where its name's closing quote ended
  bool seen_metadata_ = false;
  std::optional<std::string> held_;  // the first content fault's message
  EntryFields fields_;
  std::string key_, skipped_;  // reused: a key as read, a skipped string
};

}  // namespace

std::string invalid_safetensors_message(const std::string& path, const std::string& why) {
  return "cpprun: safetensors file " + path + " is invalid: " + why + ". Write it again, or use another file.";
}

SafetensorsFile parse_safetensors_header(std::string_view header, std::string_view data, const std::string& path) {
  try {
    return HeaderReader(header, data, path).read();
  } catch (const JsonSyntaxError& e) {
    throw CorruptCheckpointError(invalid_safetensors_message(path, std::string("its JSON header is ") + e.what()));
  }
}

}  // namespace cpprun::detail
