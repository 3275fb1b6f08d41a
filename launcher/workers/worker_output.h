// One worker's stdout and stderr as the launcher sees them: pipes the worker writes into, read in
// the launcher's event loop and copied, line by line and prefixed with the rank, to the console,
// and verbatim to the log files of --redirects/--tee.
#pragma once

#include <poll.h>

#include <array>
#include <string>
#include <string_view>
#include <vector>

#include "workers/line_splitter.h"
#include "command_line/output_spec.h"

namespace cpprun::launcher {

// Note [Worker output pipes]
// The launcher is one thread: it reads a pipe only when poll() says it is readable (together with
// the signal relay's wake-up pipe), and writes each batch of whole lines with one write(), so two
// ranks' lines cannot mix. Everything a worker wrote is in its pipe by the time it can be reaped,
// so reaping drains the pipe and flushes an unfinished last line. Processes the worker left
// behind may hold the pipe open: it stays in the poll set until EOF or the end of the attempt,
// when it is closed; what they write after that meets a closed pipe, as it would a closed
// terminal.
class OutputStream {
 public:
  enum class Kind { kStdout, kStderr };

  // Creates the pipe and opens (truncating) the target's file. Throws std::system_error.
  OutputStream(Kind kind, const StreamTarget& target, const std::string& prefix);
  ~OutputStream();
  OutputStream(const OutputStream&) = delete;
  OutputStream& operator=(const OutputStream&) = delete;

  int read_fd() const { return read_fd_; }    // -1 once closed
  int child_fd() const { return write_fd_; }  // what the worker gets as fd 1 or 2
  void close_child_end();                     // after the worker started

  // poll() said read_fd() is ready: reads one chunk (so one chatty rank cannot starve the others)
  // and routes it. Closes the pipe at EOF.
  void pump();
  // The worker was reaped: routes what the pipe holds now, then any unfinished last line.
  void drain();
  // End of the attempt: drain(), then close the pipe.
  void close();

  const LineTail& tail() const { return tail_; }  // kept for stderr only

 private:
  enum class ReadResult { kData, kEmpty, kEnd };
  ReadResult read_once();
  void route(std::string_view data);
  void add_line(std::string_view line);
  void flush_console();
  void finish();

  Kind kind_;
  int read_fd_ = -1;
  int write_fd_ = -1;
  int file_fd_ = -1;
  std::string file_path_;
  bool console_;
  std::string prefix_;
  LineSplitter splitter_;
  LineTail tail_;
  std::string batch_;  // prefixed lines waiting for one write to the console
  bool file_failed_ = false;
  std::size_t bytes_read_ = 0;
};

struct WorkerOutput {
  explicit WorkerOutput(const WorkerOutputSpec& spec)
      : out(OutputStream::Kind::kStdout, spec.out, spec.prefix),
        err(OutputStream::Kind::kStderr, spec.err, spec.prefix) {}
  OutputStream out;
  OutputStream err;
};

// write() until all of `data` is out, riding out EINTR, partial writes and a non-blocking fd.
// Returns false (errno set) on a real error.
bool write_all(int fd, std::string_view data);

}  // namespace cpprun::launcher
