// See json.h. The generic tree, for the small JSON files beside tensors (the index, configs, dumps);
// the safetensors header has its own streaming parser (safetensors_header.cpp) over the same lexer.
#include "support/json.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <set>

#include "support/json_lexer.h"

namespace cpprun::detail {
namespace {

class JsonParser {
 public:
  JsonParser(std::string_view text, int max_depth, std::size_t max_values)
      : lex_(text), max_depth_(max_depth), max_values_(max_values) {}

  Json parse_document() {
    Json value = parse_value(0);
    lex_.skip_space();
    if (!lex_.at_end()) lex_.fail("unexpected text after the JSON value");
    return value;
  }

 private:
  Json parse_value(int depth) {
    if (depth > max_depth_) lex_.fail("nested too deeply");
    if (++values_ > max_values_) lex_.fail("more than " + std::to_string(max_values_) + " values");
    Json value;
    const char c = lex_.peek();
    if (c == '{') {
      value.kind = Json::Kind::kObject;
      lex_.advance();
      std::set<std::string> seen;
      if (lex_.peek() == '}') {
        lex_.advance();
        return value;
      }
      while (true) {
        if (lex_.peek() != '"') lex_.fail("expected a key");
        std::string key = lex_.read_string();
        if (!seen.insert(key).second) lex_.fail("the key \"" + key + "\" appears twice");
        lex_.expect(':');
        value.members.emplace_back(std::move(key), parse_value(depth + 1));
        if (lex_.peek() == ',') {
          lex_.advance();
          continue;
        }
        lex_.expect('}');
        return value;
      }
    }
    if (c == '[') {
      value.kind = Json::Kind::kArray;
      lex_.advance();
      if (lex_.peek() == ']') {
        lex_.advance();
        return value;
      }
      while (true) {
        value.items.push_back(parse_value(depth + 1));
        if (lex_.peek() == ',') {
          lex_.advance();
          continue;
        }
        lex_.expect(']');
        return value;
      }
    }
    if (c == '"') {
      value.kind = Json::Kind::kString;
      value.text = lex_.read_string();
      return value;
    }
    if (JsonLexer::starts_number(c)) {
      value.kind = Json::Kind::kNumber;
      value.text = std::string(lex_.read_number());
      return value;
    }
    const std::string_view word = lex_.read_word();
    if (word.empty()) lex_.fail("unexpected character " + JsonLexer::shown(c));
    value.text = std::string(word);
    return value;
  }

  JsonLexer lex_;
  int max_depth_;
  std::size_t max_values_;
  std::size_t values_ = 0;  // parsed so far
};

}  // namespace

Json parse_json(std::string_view text, int max_depth, std::size_t max_values) {
  return JsonParser(text, max_depth, max_values).parse_document();
}

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

std::string json_string(std::string_view text) {
  std::string out;
  append_json_string(out, text);
  return out;
}

std::string json_number_text(double value) {
  char text[40];
  std::snprintf(text, sizeof text, "%.17g", value);  // 17 significant digits: the same double back
  return text;
}

std::optional<double> json_double(const Json& value) {
  if (value.kind != Json::Kind::kNumber) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const double out = std::strtod(value.text.c_str(), &end);
  // Beyond double's range (1e999), or so small that it reads as 0 (1e-400): not what was written.
  // A subnormal (1e-310, as Python's json writes it) is a double, kept.
  if (end != value.text.c_str() + value.text.size() || !std::isfinite(out) || (errno == ERANGE && out == 0)) {
    return std::nullopt;
  }
  return out;
}

}  // namespace cpprun::detail
