// Just enough JSON for the small files cpprun reads beside tensors (Hugging Face's
// model.safetensors.index.json): objects, arrays, strings, numbers kept as their text. Bounded in
// depth, strict about syntax (a repeated key is an error: the formats do not allow one). A tree
// costs 15-24 bytes per byte of text: the safetensors header, up to 100 MB, has its own streaming
// parser over the same tokens (safetensors_header.h, json_lexer.h). No LibTorch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace cpprun::detail {

struct Json {
  enum class Kind { kObject, kArray, kString, kNumber, kOther } kind = Kind::kOther;  // kOther: true/false/null
  std::vector<std::pair<std::string, Json>> members;  // an object's, in the text's order
  std::vector<Json> items;                             // an array's
  std::string text;                                    // a string's value, a number's digits, or the word
                                                       // (true, false, null)
};

// What is wrong with a text, as "malformed at byte B of N: why"; callers add the file's name.
class JsonSyntaxError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// One JSON value filling `text` (surrounding white space allowed), nested at most `max_depth`, of
// at most `max_values` values (each costs ~90 bytes: "[0,0,...]" ~45 times its text; a caller that
// knows what the text describes bounds it by that).
Json parse_json(std::string_view text, int max_depth, std::size_t max_values = SIZE_MAX);

// A number's value, or nothing when `value` is not a number or its value is not a finite double
// (1e999, 1e-400), so that the caller names the field.
std::optional<double> json_double(const Json& value);

// `text` as a JSON string literal, quotes included, appended to `out`.
void append_json_string(std::string& out, std::string_view text);

// `text` as a JSON string literal, quotes included.
std::string json_string(std::string_view text);

// A finite `value` as a JSON number that reads back as the same double.
std::string json_number_text(double value);

}  // namespace cpprun::detail
