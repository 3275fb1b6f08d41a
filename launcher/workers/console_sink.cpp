// See console_sink.h.
#include "workers/console_sink.h"

#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>

namespace cpprun::launcher {
namespace {

// What cpprun waits, at exit, for a console that takes nothing before dropping the rest.
constexpr std::chrono::seconds kExitPatience(2);

void flush_both_at_exit() {
  ConsoleSink::out().flush_before_exit(kExitPatience);
  ConsoleSink::err().flush_before_exit(kExitPatience);
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
  while (!broken_ && backlog() > 0) {
    std::size_t chunk = backlog();
    if (!regular_file_) {
      // A pipe or terminal that poll() calls writable takes PIPE_BUF bytes without blocking.
      // POLLERR or POLLHUP (the reader gone, a hung-up terminal): the write says what, a SIGPIPE
      // included.
      pollfd ready{fd_, POLLOUT, 0};
      if (poll(&ready, 1, 0) <= 0) return false;
      if ((ready.revents & POLLNVAL) != 0) {
        broken_ = true;
        break;
      }
      if ((ready.revents & (POLLOUT | POLLERR | POLLHUP)) == 0) return false;
      chunk = std::min<std::size_t>(chunk, PIPE_BUF);
    }
    const ssize_t n = ::write(fd_, pending_.data() + written_, chunk);
    if (n > 0) {
      written_ += static_cast<std::size_t>(n);
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return false;
    } else if (n < 0 && errno != EINTR) {
      // A reader that went away (`cpprun ... | head`) ends cpprun by SIGPIPE before this, as it
      // would have ended a worker writing to it directly; other errors are not worth stopping
      // the job for.
      broken_ = true;
    }
  }
  pending_.clear();
  written_ = 0;
  return true;
}

void ConsoleSink::flush_before_exit(std::chrono::milliseconds patience) {
  auto last_progress = std::chrono::steady_clock::now();
  while (!write_while_ready()) {
    const std::size_t before = backlog();
    pollfd ready{fd_, POLLOUT, 0};
    const auto waited = std::chrono::steady_clock::now() - last_progress;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(patience - waited).count();
    if (left <= 0) break;
    poll(&ready, 1, static_cast<int>(left));
    write_while_ready();
    if (backlog() < before) last_progress = std::chrono::steady_clock::now();
  }
  if (backlog() == 0 || broken_) return;
  if (fd_ != STDERR_FILENO) {
    std::fprintf(stderr, "cpprun: %zu bytes of the workers' output were not written: the console took nothing for %lld s\n",
                 backlog(), static_cast<long long>(std::chrono::duration_cast<std::chrono::seconds>(patience).count()));
  }
  pending_.clear();
  written_ = 0;
}

}  // namespace cpprun::launcher
