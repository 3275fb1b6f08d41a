// A worker's stdout and stderr: pipes read in the launcher's event loop and copied to the console
// line by line, prefixed with the rank, and verbatim to the log files of --redirects/--tee.
#pragma once

#include <cstddef>
#include <deque>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "command_line/output_spec.h"

namespace cpprun::launcher {

// Cuts a stream into whole lines, so that lines of different ranks interleave on the console but
// never mix inside one line. Pure, so unit-tested.
class LineSplitter {
 public:
  using LineSink = std::function<void(std::string_view line)>;  // without its '\n'

  // A longer line is handed out in pieces of at most this size, so a worker printing without
  // newlines cannot make the launcher hold (or a reader wait for) unbounded output.
  explicit LineSplitter(std::size_t max_line = 64 * 1024);

  // Hands `sink` every line (or over-long piece) that `data` completes; keeps the rest.
  void feed(std::string_view data, const LineSink& sink);
  // Hands out the unfinished last line, if any (the worker exited without a final newline).
  void finish(const LineSink& sink);

  bool has_partial_line() const { return !pending_.empty(); }
  // While `sink` runs: whether the piece it was handed starts a line (false for the second and
  // later pieces of an over-long line).
  bool piece_starts_line() const { return piece_starts_line_; }

 private:
  void hand_out(std::string_view piece, bool ends_line, const LineSink& sink);

  std::size_t max_line_;
  std::string pending_;  // the current line's start; shorter than max_line_ + 1 between calls
  bool piece_starts_line_ = true;
  bool next_starts_line_ = true;  // the last piece handed out ended its line
};

// The last `max_lines` lines, each cut to `max_line_bytes`: the failure summary's stderr tail.
class LineTail {
 public:
  explicit LineTail(std::size_t max_lines = 20, std::size_t max_line_bytes = 1024)
      : max_lines_(max_lines), max_line_bytes_(max_line_bytes) {}
  void push(std::string_view line);
  std::vector<std::string> lines() const { return {lines_.begin(), lines_.end()}; }  // oldest first

 private:
  std::size_t max_lines_;
  std::size_t max_line_bytes_;
  std::deque<std::string> lines_;
};

// Note [Worker output pipes]
// One thread reads a pipe only when poll() says it is readable, and writes each batch of whole
// lines with one write(), so two ranks' lines never mix. A reaped worker's output is all in its
// pipe, so reaping drains it, unfinished last line included. Orphans may hold the pipe open: it is
// polled until EOF or the attempt's end, when it is closed, as a terminal would be.
class OutputStream {
 public:
  enum class Kind { kStdout, kStderr };

  // Creates the pipe and opens (truncating) the target's file. Throws std::system_error.
  // `own_prefix`: a line the worker itself starts with it gets no `prefix` (see add_line).
  OutputStream(Kind kind, const StreamTarget& target, const std::string& prefix, const std::string& own_prefix = "");
  ~OutputStream();
  OutputStream(const OutputStream&) = delete;
  OutputStream& operator=(const OutputStream&) = delete;

  int read_fd() const { return read_fd_; }    // -1 once closed
  int child_fd() const { return write_fd_; }  // what the worker gets as fd 1 or 2
  void close_child_end();                     // after the worker started

  // poll() said read_fd() is ready: reads one chunk (so one chatty rank cannot starve the others)
  // and routes it; returns its size. Closes the pipe at EOF.
  std::size_t pump();
  // The worker was reaped, or the attempt ends: routes what the pipe holds now and any partial last line.
  void drain();

  const LineTail& tail() const { return tail_; }  // empty for stdout
  bool feeds_console() const { return console_; }

 private:
  void route(std::string_view data);
  void add_line(std::string_view line);
  void flush_console();
  void finish();

  Kind kind_;
  int read_fd_ = -1;
  int write_fd_ = -1;
  int file_fd_ = -1;
  std::string file_path_;
  int filtered_fd_ = -1;  // StreamTarget::filtered_file, appended to
  std::vector<std::string> filters_;
  std::string filtered_batch_;
  bool console_;
  std::string prefix_;
  std::string own_prefix_;
  LineSplitter splitter_;
  LineTail tail_;
  std::string batch_;  // prefixed lines waiting for one write to the console
};

struct WorkerOutput {
  explicit WorkerOutput(const WorkerOutputSpec& spec)
      : out(OutputStream::Kind::kStdout, spec.out, spec.out.tee ? spec.tee_prefix : spec.prefix,
            spec.out.tee ? "" : spec.worker_own_prefix),
        err(OutputStream::Kind::kStderr, spec.err, spec.err.tee ? spec.tee_prefix : spec.prefix,
            spec.err.tee ? "" : spec.worker_own_prefix) {}
  void drain() {
    out.drain();
    err.drain();
  }
  OutputStream out;
  OutputStream err;
};

}  // namespace cpprun::launcher
