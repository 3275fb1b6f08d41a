// JSON's tokens over a text, with no tree: white space, strings (escapes decoded to UTF-8, as
// serde_json decodes them), numbers (kept as their text), the words true/false/null, and the one
// error form "malformed at byte B of N: why". The generic parser (json.cpp) and the safetensors
// header's streaming parser (safetensors_header.cpp) both read through it, so that they accept the
// same texts and say the same of the ones they refuse. No LibTorch.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "support/json.h"

namespace cpprun::detail {

class JsonLexer {
 public:
  explicit JsonLexer(std::string_view text) : text_(text) {}

  std::size_t pos() const { return pos_; }
  bool at_end() const { return pos_ >= text_.size(); }
  void advance() { ++pos_; }

  [[noreturn]] void fail(const std::string& what) const {
    throw JsonSyntaxError("malformed at byte " + std::to_string(pos_) + " of " + std::to_string(text_.size()) +
                          ": " + what);
  }
  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\n' || text_[pos_] == '\r' ||
                                   text_[pos_] == '\t')) {
      ++pos_;
    }
  }
  // The next character after white space; the text may not end here.
  char peek() {
    skip_space();
    if (pos_ >= text_.size()) fail("it ends early");
    return text_[pos_];
  }
  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++pos_;
  }
  static bool starts_number(char c) { return c == '-' || (c >= '0' && c <= '9'); }
  // A character of the text as a message shows it: 'c' when printable ASCII, else its byte (0x1b),
  // so that no control character reaches a terminal or log raw.
  static std::string shown(char c) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte >= 0x20 && byte < 0x7F) return std::string("'") + c + "'";
    const char* hex = "0123456789abcdef";
    return std::string("byte 0x") + hex[byte >> 4] + hex[byte & 0xF];
  }

  // A string literal at the cursor, decoded into `out` (replacing what it held).
  void read_string(std::string& out) {
    expect('"');
    out.clear();
    while (true) {
      if (pos_ >= text_.size()) fail("a string is not closed");
      const char c = text_[pos_++];
      if (c == '"') return;
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
        case 'u': append_unicode_escape(out); break;
        default: fail(e >= 0x20 && e < 0x7F ? std::string("unknown escape \\") + e : "unknown escape \\ then " + shown(e));
      }
    }
  }
  std::string read_string() {
    std::string out;
    read_string(out);
    return out;
  }

  // A number at the cursor (starts_number(peek()) holds), as its text, checked against RFC 8259.
  std::string_view read_number() {
    const std::size_t start = pos_;
    while (pos_ < text_.size() && std::string_view("+-.eE0123456789").find(text_[pos_]) != std::string_view::npos) {
      ++pos_;
    }
    const std::string_view number = text_.substr(start, pos_ - start);
    if (!is_number(number)) {
      // Its first 40 characters only: a number's text has no bound but the header's.
      const bool cut = number.size() > 40;
      fail("\"" + std::string(number.substr(0, 40)) + (cut ? "...\" (" + std::to_string(number.size()) + " characters)" : "\"") +
           " is not a JSON number");
    }
    return number;
  }

  // true, false or null at the cursor, consumed; empty when none is there.
  std::string_view read_word() {
    for (std::string_view word : {"true", "false", "null"}) {
      if (text_.substr(pos_, word.size()) == word) {
        pos_ += word.size();
        return word;
      }
    }
    return {};
  }

 private:
  // RFC 8259's number: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
  static bool is_number(std::string_view text) {
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
  // \uXXXX (the "\u" read), a surrogate pair as one code point, as UTF-8. A lone surrogate is
  // refused, as serde_json (the reference safetensors reader's) refuses it for a string.
  void append_unicode_escape(std::string& out) {
    unsigned code = hex4();
    if (code >= 0xD800 && code < 0xDC00) {
      if (text_.substr(pos_, 2) != "\\u") fail("a lone surrogate in a \\u escape");
      pos_ += 2;
      const unsigned low = hex4();
      if (low < 0xDC00 || low >= 0xE000) fail("a lone surrogate in a \\u escape");
      code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
    } else if (code >= 0xDC00 && code < 0xE000) {
      fail("a lone surrogate in a \\u escape");
    }
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
  }

  std::string_view text_;
  std::size_t pos_ = 0;
};

}  // namespace cpprun::detail
