// Cutting a worker's output stream into whole lines, so that lines from different ranks can be
// interleaved on the console but never mixed inside one line; and keeping the last few of them.
// Pure, so unit-tested.
#pragma once

#include <cstddef>
#include <deque>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace cpprun::launcher {

class LineSplitter {
 public:
  using LineSink = std::function<void(std::string_view line)>;  // without its '\n'

  // A line longer than this is handed out in pieces of at most this size, so a worker printing
  // without newlines cannot make the launcher hold (or a reader wait for) unbounded output.
  static constexpr std::size_t kDefaultMaxLine = 64 * 1024;

  explicit LineSplitter(std::size_t max_line = kDefaultMaxLine);

  // Hands `sink` every line (or over-long piece) that `data` completes; keeps the rest.
  void feed(std::string_view data, const LineSink& sink);
  // Hands out the unfinished last line, if any (the worker exited without a final newline).
  void finish(const LineSink& sink);

  bool has_partial_line() const { return !pending_.empty(); }

 private:
  void emit_long(std::string_view line, bool complete, const LineSink& sink);

  std::size_t max_line_;
  std::string pending_;  // the current line's start; shorter than max_line_ + 1 between calls
};

// The last `max_lines` lines seen, each cut to `max_line_bytes`: the stderr tail shown in the
// failure summary.
class LineTail {
 public:
  explicit LineTail(std::size_t max_lines = 20, std::size_t max_line_bytes = 1024);
  void push(std::string_view line);
  std::vector<std::string> lines() const { return {lines_.begin(), lines_.end()}; }  // oldest first

 private:
  std::size_t max_lines_;
  std::size_t max_line_bytes_;
  std::deque<std::string> lines_;
};

}  // namespace cpprun::launcher
