// A small, bounded JSON reader for the files workers write for the launcher (flight-recorder dumps:
// flight_dump.h). The launcher links no JSON library, and needs only to read what it asked for.
// A worker is not trusted to be well-behaved: the depth and the size are bounded, and any fault is a
// JsonError naming the byte offset, never a crash.
#pragma once

#include <cstddef>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace cpprun::launcher {

class JsonError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct JsonValue {
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject };
  Kind kind = Kind::kNull;
  bool boolean = false;
  double number = 0;
  std::string string;
  std::vector<JsonValue> array;
  std::map<std::string, JsonValue> object;  // a repeated key keeps its last value, as Python's json

  bool is_null() const { return kind == Kind::kNull; }
  // The member `key` of an object, or nullptr (also when this is not an object).
  const JsonValue* find(const std::string& key) const;
};

// Parses `text` (UTF-8; \u escapes become UTF-8), nested at most `max_depth` deep. Throws JsonError.
JsonValue parse_json(const std::string& text, std::size_t max_depth = 32);

}  // namespace cpprun::launcher
