// Line splitting with a bound on line length, and the bounded line tail.
#include "workers/line_splitter.h"

#include <algorithm>
#include <stdexcept>

namespace cpprun::launcher {

LineSplitter::LineSplitter(std::size_t max_line) : max_line_(max_line) {
  if (max_line == 0) throw std::invalid_argument("LineSplitter: max_line must be positive");
}

void LineSplitter::emit_long(std::string_view line, bool complete, const LineSink& sink) {
  // Full pieces go out at once; a complete line's remainder too; an incomplete one's waits.
  while (line.size() > max_line_ || (complete && !line.empty())) {
    const std::size_t n = std::min(line.size(), max_line_);
    sink(line.substr(0, n));
    line.remove_prefix(n);
  }
  pending_.assign(line);
}

void LineSplitter::feed(std::string_view data, const LineSink& sink) {
  while (!data.empty()) {
    const auto newline = data.find('\n');
    if (newline == std::string_view::npos) {
      if (pending_.empty()) {
        emit_long(data, false, sink);
      } else {
        std::string joined = std::move(pending_);
        joined.append(data);
        emit_long(joined, false, sink);
      }
      return;
    }
    const std::string_view rest = data.substr(0, newline);
    if (pending_.empty()) {
      if (rest.empty()) sink(rest);  // an empty line is still a line
      emit_long(rest, true, sink);
    } else {
      std::string joined = std::move(pending_);
      joined.append(rest);
      emit_long(joined, true, sink);
    }
    data.remove_prefix(newline + 1);
  }
}

void LineSplitter::finish(const LineSink& sink) {
  if (pending_.empty()) return;
  std::string last = std::move(pending_);
  pending_.clear();
  sink(last);
}

LineTail::LineTail(std::size_t max_lines, std::size_t max_line_bytes)
    : max_lines_(max_lines), max_line_bytes_(max_line_bytes) {}

void LineTail::push(std::string_view line) {
  if (max_lines_ == 0) return;
  if (lines_.size() == max_lines_) lines_.pop_front();
  if (line.size() <= max_line_bytes_) {
    lines_.emplace_back(line);
  } else {
    lines_.emplace_back(std::string(line.substr(0, max_line_bytes_)) + " [...]");
  }
}

}  // namespace cpprun::launcher
