// Reading worker pipes and copying their contents to the console and the log files.
// See Note [Worker output pipes].
#include "workers/worker_output.h"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <system_error>

namespace cpprun::launcher {
namespace {

// One pipe's worth (Linux's default capacity): a full pipe is emptied in one read.
constexpr std::size_t kReadChunk = 64 * 1024;

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

}  // namespace

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

OutputStream::ReadResult OutputStream::read_once() {
  if (read_fd_ < 0) return ReadResult::kEnd;
  char buffer[kReadChunk];
  ssize_t n = 0;
  do {
    n = ::read(read_fd_, buffer, sizeof(buffer));
  } while (n < 0 && errno == EINTR);
  if (n > 0) {
    bytes_read_ += static_cast<std::size_t>(n);
    route({buffer, static_cast<std::size_t>(n)});
    return ReadResult::kData;
  }
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return ReadResult::kEmpty;
  finish();  // EOF, or an error that no retry would fix
  close_fd(read_fd_);
  return ReadResult::kEnd;
}

void OutputStream::pump() { read_once(); }

void OutputStream::drain() {
  // Only what is buffered now: an orphan still writing (`yes &`) must not keep us here forever.
  int buffered = 0;
  if (read_fd_ >= 0 && ioctl(read_fd_, FIONREAD, &buffered) != 0) buffered = 0;
  for (long left = buffered; left > 0;) {
    const std::size_t before = bytes_read_;
    if (read_once() != ReadResult::kData) break;
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
