// Line splitting, and reading worker pipes into the console and the log files.
// See Note [Worker output pipes].
#include "workers/worker_output.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <system_error>

namespace cpprun::launcher {
namespace {

// One pipe's worth (Linux's default capacity): a full pipe is emptied in one read.
constexpr std::size_t kReadChunk = 64 * 1024;

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

// write() until all of `data` is out, riding out EINTR, partial writes and a non-blocking fd.
// Returns false (errno set) on a real error.
bool write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n >= 0) {
      data.remove_prefix(static_cast<std::size_t>(n));
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      pollfd ready{fd, POLLOUT, 0};  // someone made our stdout non-blocking; wait instead of spinning
      poll(&ready, 1, -1);
    } else if (errno != EINTR) {
      return false;
    }
  }
  return true;
}

}  // namespace

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
    const bool complete = newline != std::string_view::npos;
    std::string_view line = data.substr(0, newline);
    std::string joined;  // only when a line continues, so most lines are never copied
    if (!pending_.empty()) {
      joined = std::move(pending_);
      joined.append(line);
      line = joined;
    }
    if (complete && line.empty()) sink(line);  // an empty line is still a line
    emit_long(line, complete, sink);
    if (!complete) return;
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

OutputStream::OutputStream(Kind kind, const StreamTarget& target, const std::string& prefix)
    : kind_(kind),
      file_path_(target.file),
      console_(target.console),
      prefix_(prefix),
      tail_(kind == Kind::kStderr ? 20 : 0) {
  int fds[2];
  // Close-on-exec: the worker gets its end through dup2(), and no other worker inherits either.
  if (pipe2(fds, O_CLOEXEC) != 0) {
    throw std::system_error(errno, std::generic_category(), "cpprun: pipe2() for a worker's output");
  }
  read_fd_ = fds[0];
  write_fd_ = fds[1];
  // Non-blocking reads: drain() reads until the pipe is empty, never waiting for more.
  fcntl(read_fd_, F_SETFL, fcntl(read_fd_, F_GETFL) | O_NONBLOCK);
  if (!file_path_.empty()) {
    file_fd_ = open(file_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (file_fd_ < 0) {
      const int error = errno;
      close_fd(read_fd_);
      close_fd(write_fd_);
      throw std::system_error(error, std::generic_category(), "cpprun: cannot create the log file " + file_path_);
    }
  }
}

OutputStream::~OutputStream() {
  close_fd(read_fd_);
  close_fd(write_fd_);
  close_fd(file_fd_);
}

void OutputStream::close_child_end() { close_fd(write_fd_); }

bool OutputStream::pump() {
  if (read_fd_ < 0) return false;
  char buffer[kReadChunk];
  ssize_t n = 0;
  do {
    n = ::read(read_fd_, buffer, sizeof(buffer));
  } while (n < 0 && errno == EINTR);
  if (n > 0) {
    bytes_read_ += static_cast<std::size_t>(n);
    route({buffer, static_cast<std::size_t>(n)});
    return true;
  }
  if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
    finish();  // EOF, or an error that no retry would fix
    close_fd(read_fd_);
  }
  return false;
}

void OutputStream::drain() {
  // Only what is buffered now: an orphan still writing (`yes &`) must not keep us here forever.
  int buffered = 0;
  if (read_fd_ >= 0 && ioctl(read_fd_, FIONREAD, &buffered) != 0) buffered = 0;
  for (long left = buffered; left > 0;) {
    const std::size_t before = bytes_read_;
    if (!pump()) break;
    left -= static_cast<long>(bytes_read_ - before);
  }
  finish();
}

void OutputStream::close() {
  drain();
  close_fd(read_fd_);
}

void OutputStream::route(std::string_view data) {
  if (file_fd_ >= 0 && !file_failed_ && !write_all(file_fd_, data)) {
    file_failed_ = true;  // warn once, keep the console going
    std::fprintf(stderr, "cpprun: warning: cannot write %s (%s); the rest of this stream is not saved\n",
                 file_path_.c_str(), std::strerror(errno));
  }
  splitter_.feed(data, [this](std::string_view line) { add_line(line); });
  flush_console();
}

void OutputStream::add_line(std::string_view line) {
  if (kind_ == Kind::kStderr) tail_.push(line);
  if (!console_) return;
  batch_ += prefix_;
  batch_ += line;
  batch_ += '\n';
}

void OutputStream::flush_console() {
  if (batch_.empty()) return;
  // A console reader that went away (`cpprun ... | head`) ends cpprun by SIGPIPE, as it would have
  // ended a worker writing to it directly; other errors are not worth stopping the job for.
  write_all(kind_ == Kind::kStdout ? STDOUT_FILENO : STDERR_FILENO, batch_);
  batch_.clear();
}

void OutputStream::finish() {
  splitter_.finish([this](std::string_view line) { add_line(line); });
  flush_console();
}

}  // namespace cpprun::launcher
