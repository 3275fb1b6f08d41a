// Line splitting, and reading worker pipes into the console and the log files.
#include "workers/worker_output.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <stdexcept>
#include <system_error>
#include <utility>

#include "workers/console_sink.h"
#include "workers/open_file_limit.h"
#include "workers/worker_process.h"

namespace cpprun::launcher {
namespace {

// One pipe's worth (Linux's default capacity): a full pipe is emptied in one read.
constexpr std::size_t kReadChunk = 64 * 1024;

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

// write() all of `data`, riding out EINTR, partial writes and a non-blocking fd; false on an error.
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

void LineSplitter::feed(std::string_view data, const LineSink& sink) {
  pending_.append(data);
  const std::string_view text = pending_;
  std::size_t start = 0;
  for (;;) {
    const std::size_t newline = text.find('\n', start);
    const std::size_t end = newline == std::string_view::npos ? text.size() : newline;
    // Full pieces of an over-long line go out at once, complete or not.
    for (; end - start > max_line_; start += max_line_) hand_out(text.substr(start, max_line_), false, sink);
    if (newline == std::string_view::npos) break;
    hand_out(text.substr(start, newline - start), true, sink);
    start = newline + 1;
  }
  pending_.erase(0, start);
}

void LineSplitter::finish(const LineSink& sink) {
  if (!pending_.empty()) {
    const std::string last = std::exchange(pending_, {});
    hand_out(last, true, sink);
  }
}

void LineSplitter::hand_out(std::string_view piece, bool ends_line, const LineSink& sink) {
  piece_starts_line_ = next_starts_line_;
  next_starts_line_ = ends_line;
  sink(piece);
}

void LineTail::push(std::string_view line) {
  if (max_lines_ == 0) return;
  if (lines_.size() == max_lines_) lines_.pop_front();
  const std::string kept(line.substr(0, max_line_bytes_));
  lines_.push_back(line.size() <= max_line_bytes_ ? kept : kept + " [...]");
}

OutputStream::OutputStream(Kind kind, const StreamTarget& target, const std::string& prefix,
                           const std::string& own_prefix)
    : kind_(kind), file_path_(target.file), filters_(target.filters), console_(target.console), prefix_(prefix),
      own_prefix_(own_prefix),
      tail_(kind == Kind::kStderr ? 20 : 0) {
  if (!file_path_.empty()) {
    file_fd_ = open(file_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (file_fd_ < 0) {
      throw std::system_error(errno, std::generic_category(), "cpprun: cannot create the log file " + file_path_);
    }
  }
  if (!target.filtered_file.empty()) {
    // Shared by the attempt's workers: O_APPEND keeps each write of whole lines in one piece.
    filtered_fd_ = open(target.filtered_file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0666);
    if (filtered_fd_ < 0) {
      const int error = errno;
      close_fd(file_fd_);
      throw std::system_error(error, std::generic_category(), "cpprun: cannot create " + target.filtered_file);
    }
  }
  int fds[2];
  // Close-on-exec: the worker gets its end through dup2(), and no other worker inherits either.
  if (pipe2(fds, O_CLOEXEC) != 0) {
    const int error = errno;
    close_fd(file_fd_);
    throw std::system_error(error, std::generic_category(),
                            "cpprun: pipe2() for a worker's output" + open_file_limit_hint(error));
  }
  read_fd_ = fds[0];
  write_fd_ = fds[1];
  // Non-blocking reads: drain() reads until the pipe is empty, never waiting for more.
  fcntl(read_fd_, F_SETFL, fcntl(read_fd_, F_GETFL) | O_NONBLOCK);
}

OutputStream::~OutputStream() {
  close_fd(read_fd_);
  close_fd(write_fd_);
  close_fd(file_fd_);
  close_fd(filtered_fd_);
}

void OutputStream::close_child_end() { close_fd(write_fd_); }

std::size_t OutputStream::pump() {
  if (read_fd_ < 0) return 0;
  char buffer[kReadChunk];
  const ssize_t n = retry_on_eintr([&] { return ::read(read_fd_, buffer, sizeof(buffer)); });
  if (n > 0) {
    route({buffer, static_cast<std::size_t>(n)});
    return static_cast<std::size_t>(n);
  }
  if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
    finish();  // EOF, or an error that no retry would fix
    close_fd(read_fd_);
  }
  return 0;
}

void OutputStream::drain() {
  // Only what is buffered now: an orphan still writing (`yes &`) must not keep us here forever.
  int left = 0;
  if (read_fd_ >= 0 && ioctl(read_fd_, FIONREAD, &left) != 0) left = 0;
  for (std::size_t got = 0; left > 0 && (got = pump()) > 0;) left -= static_cast<int>(got);
  finish();
}

void OutputStream::route(std::string_view data) {
  if (file_fd_ >= 0 && !write_all(file_fd_, data)) {
    const int error = errno;  // before the message's own writes
    std::cerr << "cpprun: warning: cannot write " << file_path_ << " (" << std::strerror(error)
              << "); the rest of this stream is not saved\n";
    close_fd(file_fd_);  // warn once, keep the console going
  }
  splitter_.feed(data, [this](std::string_view line) { add_line(line); });
  flush_console();
}

void OutputStream::add_line(std::string_view line) {
  tail_.push(line);  // a no-op for stdout
  if (!console_) return;
  // torch.distributed's excepthook writes "[rankN]: " before every line of a worker's traceback,
  // the very prefix cpprun adds by default (WorkerOutputSpec::worker_own_prefix): a line, not a
  // later piece of an over-long one, that already starts with it is printed once prefixed.
  const bool prefixed = !own_prefix_.empty() && splitter_.piece_starts_line() &&
                        line.substr(0, own_prefix_.size()) == own_prefix_;
  const std::string_view prefix = prefixed ? std::string_view() : std::string_view(prefix_);
  batch_.append(prefix).append(line).append("\n");
  const auto holds = [&](const std::string& needle) { return line.find(needle) != std::string_view::npos; };
  if (filtered_fd_ >= 0 && std::any_of(filters_.begin(), filters_.end(), holds)) {
    filtered_batch_.append(prefix).append(line).append("\n");
  }
}

void OutputStream::flush_console() {
  if (batch_.empty()) return;
  // Never blocks: Note [A console that does not read].
  (kind_ == Kind::kStdout ? ConsoleSink::out() : ConsoleSink::err()).write(batch_);
  batch_.clear();
  if (!filtered_batch_.empty()) {
    write_all(filtered_fd_, filtered_batch_);
    filtered_batch_.clear();
  }
}

void OutputStream::finish() {
  splitter_.finish([this](std::string_view line) { add_line(line); });
  flush_console();
}

}  // namespace cpprun::launcher
