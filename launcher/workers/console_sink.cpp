// See console_sink.h.
#include "workers/console_sink.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <string>

namespace cpprun::launcher {
namespace {

// What cpprun waits, at exit, for a console that takes nothing before dropping the rest.
constexpr std::chrono::seconds kExitPatience(2);
// Written bytes are cut from the front of the buffer once they pass this (and half of it), so a
// console that keeps reading, if slowly, never makes the buffer grow past the backlog limit.
constexpr std::size_t kCompactBytes = 64 * 1024;

void flush_both_at_exit() {
  const std::size_t dropped = ConsoleSink::out().flush_before_exit(kExitPatience);
  if (dropped > 0) {
    ConsoleSink::err().write("cpprun: " + std::to_string(dropped) + " bytes of the workers' output were not "
                             "written: the console took nothing for " + std::to_string(kExitPatience.count()) + " s\n");
  }
  ConsoleSink::err().flush_before_exit(kExitPatience);  // what it drops has nowhere to be told
}

ConsoleSink& registered(int fd) {
  // Never destroyed: worker output may still be written during static destruction.
  static ConsoleSink* const out = new ConsoleSink(STDOUT_FILENO);
  static ConsoleSink* const err = new ConsoleSink(STDERR_FILENO);
  static const bool at_exit = std::atexit(flush_both_at_exit) == 0;
  (void)at_exit;
  return fd == STDOUT_FILENO ? *out : *err;
}

}  // namespace

ConsoleSink::ConsoleSink(int fd) : fd_(fd) {
  struct stat info {};
  regular_file_ = fstat(fd, &info) == 0 && S_ISREG(info.st_mode);
  if (!regular_file_) {
    // A description of our own, non-blocking, of the same pipe or terminal: O_NONBLOCK on the one
    // we inherited would change it for the shell and every process sharing it. A terminal that
    // poll() calls writable may still block a write longer than its room; this one cannot.
    // O_NOCTTY: reopening a terminal must not make it ours. A socket cannot be reopened so: it is
    // written PIPE_BUF bytes at a time when poll() says it can take them.
    const std::string path = "/proc/self/fd/" + std::to_string(fd);
    own_fd_ = ::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  }
}

ConsoleSink::~ConsoleSink() {
  if (own_fd_ >= 0) ::close(own_fd_);
}

ConsoleSink& ConsoleSink::out() { return registered(STDOUT_FILENO); }
ConsoleSink& ConsoleSink::err() { return registered(STDERR_FILENO); }

void ConsoleSink::write(std::string_view data) {
  if (broken_ || data.empty()) return;
  pending_.append(data);
  write_while_ready();
}

void ConsoleSink::write_ready() { write_while_ready(); }

bool ConsoleSink::write_while_ready() {
  bool all = true;
  while (!broken_ && backlog() > 0) {
    std::size_t chunk = backlog();
    if (!regular_file_ && own_fd_ < 0) {
      // POLLERR or POLLHUP (the reader gone, a hung-up terminal): the write says what, a SIGPIPE
      // included.
      pollfd ready{fd_, POLLOUT, 0};
      if (poll(&ready, 1, 0) <= 0) {
        all = false;
        break;
      }
      if ((ready.revents & POLLNVAL) != 0) {
        broken_ = true;
        break;
      }
      if ((ready.revents & (POLLOUT | POLLERR | POLLHUP)) == 0) {
        all = false;
        break;
      }
      chunk = std::min<std::size_t>(chunk, PIPE_BUF);
    }
    const ssize_t n = ::write(own_fd_ >= 0 ? own_fd_ : fd_, pending_.data() + written_, chunk);
    if (n > 0) {
      written_ += static_cast<std::size_t>(n);
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      all = false;
      break;
    } else if (n < 0 && errno != EINTR) {
      // A reader that went away (`cpprun ... | head`) ends cpprun by SIGPIPE before this, as it
      // would have ended a worker writing to it directly; other errors are not worth stopping
      // the job for.
      broken_ = true;
    }
  }
  if (broken_ || backlog() == 0) {
    pending_.clear();
    written_ = 0;
  } else if (written_ >= kCompactBytes && written_ * 2 >= pending_.size()) {
    pending_.erase(0, written_);
    written_ = 0;
  }
  return all || broken_;
}

std::size_t ConsoleSink::flush_before_exit(std::chrono::milliseconds patience) {
  auto last_progress = std::chrono::steady_clock::now();
  while (!write_while_ready()) {
    const std::size_t before = backlog();
    const auto waited = std::chrono::steady_clock::now() - last_progress;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(patience - waited).count();
    if (left <= 0) break;
    pollfd ready{poll_fd(), POLLOUT, 0};
    poll(&ready, 1, static_cast<int>(left));
    write_while_ready();
    if (backlog() < before) last_progress = std::chrono::steady_clock::now();
  }
  const std::size_t dropped = broken_ ? 0 : backlog();
  pending_.clear();
  written_ = 0;
  return dropped;
}

}  // namespace cpprun::launcher
