// Recursive descent over RFC 8259, with a depth bound so that a hostile file cannot exhaust the stack.
#include "diagnosis/json_reader.h"

#include <cmath>
#include <cstdlib>

namespace cpprun::launcher {
namespace {

class Reader {
 public:
  Reader(const std::string& text, std::size_t max_depth) : text_(text), max_depth_(max_depth) {}

  JsonValue document() {
    JsonValue value = parse_value(0);
    skip_space();
    if (pos_ != text_.size()) fail("unexpected text after the document");
    return value;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw JsonError("invalid JSON at byte " + std::to_string(pos_) + ": " + what);
  }

  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' ||
                                   text_[pos_] == '\r')) {
      ++pos_;
    }
  }

  bool take(char c) {
    skip_space();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  void expect(char c) {
    if (!take(c)) fail(std::string("expected '") + c + "'");
  }

  bool take_word(const char* word) {
    const std::string w(word);
    if (text_.compare(pos_, w.size(), w) != 0) return false;
    pos_ += w.size();
    return true;
  }

  JsonValue parse_value(std::size_t depth) {
    if (depth > max_depth_) fail("nested deeper than " + std::to_string(max_depth_));
    skip_space();
    if (pos_ >= text_.size()) fail("unexpected end");
    JsonValue value;
    const char c = text_[pos_];
    if (c == '{') {
      ++pos_;
      value.kind = JsonValue::Kind::kObject;
      if (take('}')) return value;
      do {
        skip_space();
        if (pos_ >= text_.size() || text_[pos_] != '"') fail("expected a member name");
        std::string key = parse_string();
        expect(':');
        value.object[std::move(key)] = parse_value(depth + 1);
      } while (take(','));
      expect('}');
    } else if (c == '[') {
      ++pos_;
      value.kind = JsonValue::Kind::kArray;
      if (take(']')) return value;
      do {
        value.array.push_back(parse_value(depth + 1));
      } while (take(','));
      expect(']');
    } else if (c == '"') {
      value.kind = JsonValue::Kind::kString;
      value.string = parse_string();
    } else if (take_word("true")) {
      value.kind = JsonValue::Kind::kBool;
      value.boolean = true;
    } else if (take_word("false")) {
      value.kind = JsonValue::Kind::kBool;
    } else if (take_word("null")) {
      value.kind = JsonValue::Kind::kNull;
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      value.kind = JsonValue::Kind::kNumber;
      value.number = parse_number();
    } else {
      fail(std::string("unexpected character '") + c + "'");
    }
    return value;
  }

  double parse_number() {
    const std::size_t start = pos_;
    if (text_[pos_] == '-') ++pos_;
    const auto digits = [&] {
      const std::size_t from = pos_;
      while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') ++pos_;
      if (pos_ == from) fail("expected a digit");
    };
    digits();
    if (pos_ < text_.size() && text_[pos_] == '.') {
      ++pos_;
      digits();
    }
    if (pos_ < text_.size() && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
      ++pos_;
      if (pos_ < text_.size() && (text_[pos_] == '+' || text_[pos_] == '-')) ++pos_;
      digits();
    }
    const double number = std::strtod(text_.substr(start, pos_ - start).c_str(), nullptr);
    if (!std::isfinite(number)) fail("a number out of range");
    return number;
  }

  unsigned hex4() {
    if (pos_ + 4 > text_.size()) fail("a short \\u escape");
    unsigned code = 0;
    for (int i = 0; i < 4; ++i) {
      const char h = text_[pos_++];
      code <<= 4;
      if (h >= '0' && h <= '9') code |= static_cast<unsigned>(h - '0');
      else if (h >= 'a' && h <= 'f') code |= static_cast<unsigned>(h - 'a' + 10);
      else if (h >= 'A' && h <= 'F') code |= static_cast<unsigned>(h - 'A' + 10);
      else fail("a bad \\u escape");
    }
    return code;
  }

  static void append_utf8(std::string& out, unsigned code) {
    if (code < 0x80) {
      out += static_cast<char>(code);
    } else if (code < 0x800) {
      out += static_cast<char>(0xC0 | (code >> 6));
      out += static_cast<char>(0x80 | (code & 0x3F));
    } else if (code < 0x10000) {
      out += static_cast<char>(0xE0 | (code >> 12));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (code & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (code >> 18));
      out += static_cast<char>(0x80 | ((code >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (code & 0x3F));
    }
  }

  std::string parse_string() {
    ++pos_;  // the opening quote
    std::string out;
    for (;;) {
      if (pos_ >= text_.size()) fail("an unterminated string");
      const char c = text_[pos_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("a control character in a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= text_.size()) fail("an unterminated escape");
      const char e = text_[pos_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          unsigned code = hex4();
          if (code >= 0xD800 && code < 0xDC00 && text_.compare(pos_, 2, "\\u") == 0) {
            pos_ += 2;
            const unsigned low = hex4();
            if (low < 0xDC00 || low >= 0xE000) fail("a lone surrogate");
            code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
          }
          append_utf8(out, code);
          break;
        }
        default: fail(std::string("an unknown escape '\\") + e + "'");
      }
    }
  }

  const std::string& text_;
  std::size_t max_depth_;
  std::size_t pos_ = 0;
};

}  // namespace

const JsonValue* JsonValue::find(const std::string& key) const {
  if (kind != Kind::kObject) return nullptr;
  const auto it = object.find(key);
  return it == object.end() ? nullptr : &it->second;
}

JsonValue parse_json(const std::string& text, std::size_t max_depth) { return Reader(text, max_depth).document(); }

}  // namespace cpprun::launcher
