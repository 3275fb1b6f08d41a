// See console_sink.h.
#include "workers/console_sink.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <streambuf>
#include <string>
#include <thread>

namespace cpprun::launcher {
namespace {

// What cpprun waits, at exit, for a console that takes nothing before dropping the rest.
constexpr std::chrono::seconds kExitPatience(2);
// Written bytes are cut from the front of the buffer once they pass this (and half of it), so a
// console that keeps reading, if slowly, never makes the buffer grow past the backlog limit.
constexpr std::size_t kCompactBytes = 64 * 1024;

// Set once the sinks were flushed at exit (or std::terminate): std::cerr then goes straight to fd 2.
std::atomic<bool> g_sinks_closed{false};
// main()'s thread, the only one that may use the sinks (route_stderr_through_sink()).
std::thread::id g_sink_thread;

void flush_both_at_exit() {
  if (g_sinks_closed.exchange(true)) return;
  const std::size_t dropped = ConsoleSink::out().flush_before_exit(kExitPatience);
  if (dropped > 0) {
    ConsoleSink::err().write_own("cpprun: " + std::to_string(dropped) + " bytes of the workers' output were not "
                                 "written: the console took nothing for " + std::to_string(kExitPatience.count()) +
                                 " s\n");
  }
  ConsoleSink::err().flush_before_exit(kExitPatience);  // what it drops has nowhere to be told
}

// Blocking, as std::cerr wrote before: for the lines the sink cannot take (Note [The launcher's own lines]).
void write_straight(std::string_view text) {
  while (!text.empty()) {
    const ssize_t n = ::write(STDERR_FILENO, text.data(), text.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    text.remove_prefix(static_cast<std::size_t>(n));
  }
}

// std::cerr's buffer: none; each piece goes to the stderr sink as it comes (std::cerr is unit-buffered).
class SinkStreambuf : public std::streambuf {
 protected:
  std::streamsize xsputn(const char* data, std::streamsize count) override {
    forward(std::string_view(data, static_cast<std::size_t>(count)));
    return count;
  }
  int_type overflow(int_type c) override {
    if (traits_type::eq_int_type(c, traits_type::eof())) return traits_type::not_eof(c);
    const char ch = traits_type::to_char_type(c);
    forward(std::string_view(&ch, 1));
    return c;
  }

 private:
  static void forward(std::string_view text) {
    if (!g_sinks_closed.load() && std::this_thread::get_id() == g_sink_thread) {
      ConsoleSink::err().write_own(text);
    } else {
      write_straight(text);
    }
  }
};

std::terminate_handler g_previous_terminate = nullptr;

[[noreturn]] void flush_then_terminate() {
  if (std::this_thread::get_id() == g_sink_thread) flush_both_at_exit();
  g_sinks_closed.store(true);
  if (g_previous_terminate != nullptr) g_previous_terminate();
  std::abort();
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
  appended_ += data.size();
  write_while_ready();
}

void ConsoleSink::write_own(std::string_view data) {
  if (broken_ || data.empty()) return;
  own_.emplace_back(appended_, std::string(data));
  write(data);
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
      delivered_ += static_cast<unsigned long long>(n);
      at_line_start_ = pending_[written_ - 1] == '\n';
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
  if (broken_) delivered_ = appended_;  // the rest is dropped
  forget_written();
  return all || broken_;
}

void ConsoleSink::forget_written() {
  if (broken_ || backlog() == 0) {
    pending_.clear();
    written_ = 0;
  } else if (written_ >= kCompactBytes && written_ * 2 >= pending_.size()) {
    pending_.erase(0, written_);
    written_ = 0;
  }
  while (!own_.empty() && own_.front().first + own_.front().second.size() <= delivered_) own_.pop_front();
}

std::size_t ConsoleSink::write_within(const std::string& text, std::chrono::milliseconds patience) {
  pending_ = text;
  written_ = 0;
  own_.clear();
  appended_ = delivered_ + text.size();
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
  return broken_ ? 0 : backlog();
}

std::size_t ConsoleSink::flush_before_exit(std::chrono::milliseconds patience) {
  std::size_t dropped = 0;
  if (!write_while_ready()) {
    // The launcher's own lines still waiting, in order: taken out before the first wait, which
    // forgets them as they are written.
    std::string waiting = pending_.substr(written_);
    std::vector<std::pair<unsigned long long, std::string>> own(own_.begin(), own_.end());
    const std::size_t left = write_within(waiting, patience);
    if (left > 0) {
      // Given up: the workers' bytes are dropped, the launcher's own lines still not written get one
      // more try, on a line of their own. A partly written one goes on where it stopped.
      std::string rest;
      bool starts_inside = false;
      for (const auto& [offset, line] : own) {
        const unsigned long long end = offset + line.size();
        if (end <= delivered_) continue;
        if (offset < delivered_) starts_inside = rest.empty();
        rest += line.substr(offset < delivered_ ? static_cast<std::size_t>(delivered_ - offset) : 0);
      }
      dropped = left - std::min(left, rest.size());
      if (!rest.empty()) {
        if (!at_line_start_ && !starts_inside) rest.insert(0, "\n");
        write_within(rest, patience);
      }
    }
  }
  if (broken_) dropped = 0;
  pending_.clear();
  written_ = 0;
  own_.clear();
  delivered_ = appended_;
  return dropped;
}

void route_stderr_through_sink() {
  static SinkStreambuf* const sink_buffer = new SinkStreambuf;  // never destroyed: used at exit
  g_sink_thread = std::this_thread::get_id();
  ConsoleSink::err();  // registers the exit flush now, before anything that prints in its destructor
  std::cerr.rdbuf(sink_buffer);
  g_previous_terminate = std::set_terminate(flush_then_terminate);
}

std::size_t ConsoleWait::add(std::vector<pollfd>& fds) {
  first_ = fds.size();
  sinks_.clear();
  for (ConsoleSink* console : {&ConsoleSink::out(), &ConsoleSink::err()}) {
    if (console->backlog() == 0) continue;
    fds.push_back({console->poll_fd(), POLLOUT, 0});
    sinks_.push_back(console);
  }
  return sinks_.size();
}

void ConsoleWait::after(const std::vector<pollfd>& fds) const {
  for (std::size_t i = 0; i < sinks_.size(); ++i) {
    if (fds.at(first_ + i).revents != 0) sinks_[i]->write_ready();
  }
}

}  // namespace cpprun::launcher
