// See json.h. The parser the safetensors reader started with, shared with the index reader.
#include "support/json.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <set>

namespace cpprun::detail {
namespace {

// RFC 8259's number: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
bool is_json_number(std::string_view text) {
  std::size_t i = 0;
  const auto digits = [&] {
    const std::size_t from = i;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9') ++i;
    return i - from;
  };
  if (i < text.size() && text[i] == '-') ++i;
  if (i < text.size() && text[i] == '0') {
    ++i;
  } else if (digits() == 0) {
    return false;
  }
  if (i < text.size() && text[i] == '.') {
    ++i;
    if (digits() == 0) return false;
  }
  if (i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    ++i;
    if (i < text.size() && (text[i] == '+' || text[i] == '-')) ++i;
    if (digits() == 0) return false;
  }
  return i == text.size();
}

class JsonParser {
 public:
  JsonParser(std::string_view text, int max_depth) : text_(text), max_depth_(max_depth) {}

  Json parse_document() {
    Json value = parse_value(0);
    skip_space();
    if (pos_ != text_.size()) fail("unexpected text after the JSON value");
    return value;
  }

 private:
  [[noreturn]] void fail(const std::string& what) {
    throw JsonSyntaxError("malformed at byte " + std::to_string(pos_) + " of " + std::to_string(text_.size()) +
                          ": " + what);
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
    if (depth > max_depth_) fail("nested too deeply");
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
      if (!is_json_number(value.text)) fail("\"" + value.text + "\" is not a JSON number");
      return value;
    }
    for (std::string_view word : {"true", "false", "null"}) {
      if (text_.substr(pos_, word.size()) == word) {
        pos_ += word.size();
        value.text = std::string(word);
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
  int max_depth_;
  std::size_t pos_ = 0;
};

}  // namespace

Json parse_json(std::string_view text, int max_depth) { return JsonParser(text, max_depth).parse_document(); }

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
