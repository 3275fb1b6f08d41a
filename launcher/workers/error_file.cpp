// Setting errorCode in a worker's error file without a JSON library: a scanner that skips values.
#include "workers/error_file.h"

#include <cctype>
#include <cstdlib>
#include <iostream>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <fstream>
#include <optional>
#include <sstream>

#include "cpprun/launcher_contract.h"
#include "support/json.h"  // json_string, parse_json
#include "workers/attempt.h"

namespace cpprun::launcher {
namespace {

// Positions in `text`, a JSON document; each returns the index after what it read, or npos on bad JSON.
class Scanner {
 public:
  explicit Scanner(const std::string& text) : text_(text) {}

  std::size_t space(std::size_t i) const {
    while (i < text_.size() && std::isspace(static_cast<unsigned char>(text_[i]))) ++i;
    return i;
  }

  // A string starting at text[i] == '"'; `out` gets its raw (escaped) contents.
  std::size_t string(std::size_t i, std::string* out = nullptr) const {
    if (i >= text_.size() || text_[i] != '"') return npos;
    for (std::size_t j = i + 1; j < text_.size(); ++j) {
      if (text_[j] == '\\') {
        ++j;
      } else if (text_[j] == '"') {
        if (out != nullptr) *out = text_.substr(i + 1, j - i - 1);
        return j + 1;
      }
    }
    return npos;
  }

  // A worker writes the file: nesting deeper than any error file's is refused (npos), not
  // followed down the launcher's stack.
  static constexpr int kMaxDepth = 64;

  std::size_t value(std::size_t i, int depth = 0) const {
    i = space(i);
    if (i >= text_.size() || depth > kMaxDepth) return npos;
    if (text_[i] == '"') return string(i);
    if (text_[i] == '{' || text_[i] == '[') {
      const char close = text_[i] == '{' ? '}' : ']';
      i = space(i + 1);
      if (i < text_.size() && text_[i] == close) return i + 1;
      for (;;) {
        if (close == '}') {
          i = string(space(i));
          if (i == npos || (i = space(i)) >= text_.size() || text_[i] != ':') return npos;
          ++i;
        }
        if ((i = value(i, depth + 1)) == npos || (i = space(i)) >= text_.size()) return npos;
        if (text_[i] == close) return i + 1;
        if (text_[i] != ',') return npos;
        ++i;
      }
    }
    // A number, true, false or null.
    const std::size_t start = i;
    while (i < text_.size() && (std::isalnum(static_cast<unsigned char>(text_[i])) || std::strchr("+-.", text_[i]))) {
      ++i;
    }
    return i > start ? i : npos;
  }

  // In the object at text[i] == '{': where the value of `key` starts and ends, and the object's '}'.
  struct Member {
    std::size_t value_start = npos;
    std::size_t value_end = npos;
    std::size_t close = npos;
    bool empty = true;
  };
  std::optional<Member> find(std::size_t i, const std::string& key) const {
    if (i >= text_.size() || text_[i] != '{') return std::nullopt;
    Member member;
    i = space(i + 1);
    if (i < text_.size() && text_[i] == '}') {
      member.close = i;
      return member;
    }
    member.empty = false;
    for (;;) {
      std::string name;
      i = string(space(i), &name);
      if (i == npos || (i = space(i)) >= text_.size() || text_[i] != ':') return std::nullopt;
      const std::size_t start = space(i + 1);
      const std::size_t end = value(start);
      if (end == npos) return std::nullopt;
      if (name == key) {
        member.value_start = start;
        member.value_end = end;
      }
      i = space(end);
      if (i >= text_.size()) return std::nullopt;
      if (text_[i] == '}') {
        member.close = i;
        return member;
      }
      if (text_[i] != ',') return std::nullopt;
      ++i;
    }
  }

  // In the object at text[i]: where the value of `key` starts when that value is an object too.
  std::optional<std::size_t> object(std::size_t i, const std::string& key) const {
    const std::optional<Member> member = find(i, key);
    if (!member || member->value_start == npos || text_[member->value_start] != '{') return std::nullopt;
    return member->value_start;
  }

  static constexpr std::size_t npos = std::string::npos;

 private:
  const std::string& text_;
};

}  // namespace

std::string with_error_code(const std::string& json, int error_code) {
  if (error_code == 0) return json;
  const Scanner scan(json);
  const std::optional<std::size_t> message = scan.object(scan.space(0), contract::kErrorFileMessageKey);
  if (!message) return json;
  const std::optional<Scanner::Member> code = scan.find(*message, contract::kErrorFileCodeKey);
  if (!code) return json;
  const std::string value = std::to_string(error_code);
  if (code->value_start != Scanner::npos) {
    return json.substr(0, code->value_start) + value + json.substr(code->value_end);
  }
  return json.substr(0, code->close) + (code->empty ? "" : ", ") + "\"" + contract::kErrorFileCodeKey + "\": " + value + json.substr(code->close);
}

std::optional<long long> recorded_failure_ms(const std::string& json) {
  const Scanner scan(json);
  const std::optional<std::size_t> message = scan.object(scan.space(0), contract::kErrorFileMessageKey);
  const std::optional<std::size_t> extra = message ? scan.object(*message, contract::kErrorFileExtraInfoKey) : std::nullopt;
  if (!extra) return std::nullopt;
  const std::optional<Scanner::Member> at = scan.find(*extra, contract::kErrorFileFailedAtMsKey);
  if (!at || at->value_start == Scanner::npos) return std::nullopt;
  std::string digits;  // written as a string, as torch writes its timestamp
  if (scan.string(at->value_start, &digits) != at->value_end || digits.empty() || digits.size() > 18 ||
      digits.find_first_not_of("0123456789") != std::string::npos) {
    return std::nullopt;
  }
  return std::stoll(digits);
}

std::size_t root_cause_by_report_time(std::size_t first_exited, const std::vector<std::optional<long long>>& failed_at_ms) {
  if (first_exited >= failed_at_ms.size() || !failed_at_ms[first_exited]) return first_exited;
  std::size_t root = first_exited;
  for (std::size_t i = 0; i < failed_at_ms.size(); ++i) {
    if (failed_at_ms[i] && *failed_at_ms[i] < *failed_at_ms[root]) root = i;
  }
  return root;
}

namespace {

// Why `text` is not what torchrun's json.load would read, or nothing when it may be. An object or
// array is read as Scanner reads it, which takes what json.load takes beyond strict JSON and
// parse_json refuses: NaN, Infinity, a repeated key, a lone surrogate escape (json.dump writes one
// for a path that is not UTF-8). parse_json says what is wrong.
std::optional<std::string> why_not_json(const std::string& text) {
  const Scanner scan(text);
  const std::size_t start = scan.space(0);
  const bool container = start < text.size() && (text[start] == '{' || text[start] == '[');
  const std::size_t end = container ? scan.value(start) : Scanner::npos;
  if (end != Scanner::npos && scan.space(end) == text.size()) return std::nullopt;
  try {
    detail::parse_json(text, Scanner::kMaxDepth);
  } catch (const detail::JsonSyntaxError& e) {
    return std::string(e.what());
  }
  return std::nullopt;  // strict JSON that is no object or array (a string, a number): json.load reads it
}

// Replaces the launcher's error file with `json`: "" when written, else the warning to print,
// naming `what` was being written.
std::string write_launcher_error_file(const std::string& path, const std::string& json, const std::string& what) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << json;
  out.close();
  if (!out) return "cpprun: could not write " + what + " to TORCHELASTIC_ERROR_FILE=" + path + ": " + std::strerror(errno);
  return "";
}

}  // namespace

std::string copy_root_error_file(const std::string& worker_error_file, const std::string& launcher_error_file,
                                 int error_code) {
  if (worker_error_file.empty() || launcher_error_file.empty()) return "";
  std::ifstream in(worker_error_file, std::ios::binary);
  if (!in) return "";  // the worker wrote none (torch's @record writes one for an uncaught exception)
  std::ostringstream text;
  text << in.rdbuf();
  std::string json = text.str();
  if (const std::optional<std::string> why = why_not_json(json)) {
    // torchrun's json.load fails on it, and its launcher's own error (a JSONDecodeError) is what its
    // error file then holds: valid JSON for the scheduler that reads it, never the bytes as they are.
    json = launcher_error_json("cpprun: the root cause's error file " + worker_error_file + " is not JSON (" + *why +
                                   "), so it was not copied; the worker's exit code was " + std::to_string(error_code),
                               static_cast<long long>(std::time(nullptr)));
  } else {
    json = with_error_code(json, error_code);
  }
  return write_launcher_error_file(launcher_error_file, json, "the root cause's error file");
}

std::string launcher_error_json(const std::string& text, long long unix_seconds) {
  return std::string("{\"") + contract::kErrorFileMessageKey + "\": {\"" + contract::kErrorFileMessageKey + "\": " +
         detail::json_string(text) + ", \"" + contract::kErrorFileExtraInfoKey + "\": {\"" + contract::kErrorFileCallstackKey +
         "\": \"\", \"" + contract::kErrorFileTimestampKey + "\": \"" + std::to_string(unix_seconds) + "\"}}}\n";
}

void record_launcher_error(const std::string& text) {
  const char* path = std::getenv(contract::kErrorFileVariable);
  if (path == nullptr || *path == '\0') return;
  const std::string warning =
      write_launcher_error_file(path, launcher_error_json(text, static_cast<long long>(std::time(nullptr))), "its error");
  if (!warning.empty()) std::cerr << warning << "\n";
}

void hand_over_error_file(const AttemptEnd& attempt) {
  if (attempt.end == GroupEnd::kUnhealthy) {  // no worker failed, so no worker's file: the launcher's own words
    record_launcher_error("cpprun: " + attempt.root_worker + " " + attempt.root_how +
                          "; the workers were stopped, with no restart");
    return;
  }
  const char* mine = std::getenv(contract::kErrorFileVariable);
  const std::string warning =
      copy_root_error_file(attempt.root_error_file, mine != nullptr ? mine : "", attempt.root_error_code);
  if (!warning.empty()) std::cerr << warning << "\n";
}

}  // namespace cpprun::launcher
