// The relay of Note [The keeper's log never stops the store] (store_keeper_log.h).
#include "comm/store_keeper_log.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <streambuf>
#include <string>
#include <system_error>
#include <thread>

namespace cpprun::keeper {
namespace {

constexpr std::size_t kLongestLine = 16 * 1024;  // a longer one is cut into lines of this size
constexpr double kReportAfterSeconds = 2;
constexpr int kConsoleWaitMs = 50;  // for the rest of a line the console took in part

double seconds_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// What the pipe could not take (it was full: the relay fell behind), counted by the writers.
std::atomic<std::int64_t> bytes_not_taken{0};

// std::cerr and std::clog's buffer while the relay runs (LibTorch's log goes through std::cerr):
// a write to the pipe that fails (full) drops the bytes, counts them and reports success, so that
// the stream never turns bad. Through stdio's stderr it took badbit at the first full pipe and
// wrote nothing more, for good (a review, 2026-12-07).
class PipeBuffer final : public std::streambuf {
 protected:
  int_type overflow(int_type c) override {
    if (traits_type::eq_int_type(c, traits_type::eof())) return traits_type::not_eof(c);
    const char byte = traits_type::to_char_type(c);
    put(&byte, 1);
    return c;
  }
  std::streamsize xsputn(const char* data, std::streamsize size) override {
    put(data, static_cast<std::size_t>(size));
    return size;
  }

 private:
  static void put(const char* data, std::size_t size) {
    while (size > 0) {
      const ssize_t wrote = write(STDERR_FILENO, data, size);
      if (wrote > 0) {
        data += wrote;
        size -= static_cast<std::size_t>(wrote);
      } else if (!(wrote < 0 && errno == EINTR)) {
        bytes_not_taken += static_cast<std::int64_t>(size);
        return;
      }
    }
  }
};

// The console as the relay writes to it: a pipe, FIFO or terminal reopened through /proc, so that
// its O_NONBLOCK is the relay's alone, not cpprun's too; a regular file (writes never wait) or a
// socket (which cannot be reopened so) as it is.
int console_for_relay(int console) {
  struct stat st {};
  if (fstat(console, &st) == 0 && (S_ISFIFO(st.st_mode) || S_ISCHR(st.st_mode))) {
    const std::string path = "/proc/self/fd/" + std::to_string(console);
    const int reopened = open(path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (reopened >= 0) return reopened;
  }
  return fcntl(console, F_DUPFD_CLOEXEC, 3);
}

// Writes a line: false, at once, where the console takes none of it now (the relay goes on reading
// the pipe rather than wait); a line taken in part is finished within kConsoleWaitMs or cut.
bool write_line(int fd, const char* data, std::size_t size) {
  bool started = false;
  while (size > 0) {
    const ssize_t wrote = write(fd, data, size);
    if (wrote > 0) {
      data += wrote;
      size -= static_cast<std::size_t>(wrote);
      started = true;
      continue;
    }
    if (wrote < 0 && errno == EINTR) continue;
    if (started && wrote < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd ready{fd, POLLOUT, 0};
      if (poll(&ready, 1, kConsoleWaitMs) > 0) continue;
    }
    return false;
  }
  return true;
}

void relay(int from, int console) {
  LogLineBudget budget(kBurstLines, kLinesPerSecond);
  std::string pending;
  std::int64_t not_taken = 0;  // bytes the pipe refused, since the last report
  double first_not_taken_s = 0;
  char buffer[64 * 1024];
  for (bool open = true; open;) {
    pollfd ready{from, POLLIN, 0};
    const int events = poll(&ready, 1, 1000);
    const double now = seconds_now();
    if (events > 0) {
      const ssize_t got = read(from, buffer, sizeof(buffer));
      if (got > 0) pending.append(buffer, static_cast<std::size_t>(got));
      if (got == 0 || (got < 0 && errno != EINTR && errno != EAGAIN)) {
        open = false;  // every writer is gone: the keeper ends, or finish_relay()
        if (!pending.empty() && pending.back() != '\n') pending += '\n';
      }
    }
    std::size_t start = 0;
    for (;;) {
      std::size_t end = pending.find('\n', start);
      if (end == std::string::npos && pending.size() - start >= kLongestLine) end = start + kLongestLine - 1;
      if (end == std::string::npos) break;
      if (budget.take(now) && !write_line(console, pending.data() + start, end + 1 - start)) budget.left_out(now);
      start = end + 1;
    }
    pending.erase(0, start);
    if (const std::int64_t refused = bytes_not_taken.exchange(0); refused > 0) {
      if (not_taken == 0) first_not_taken_s = now;
      not_taken += refused;
    }
    const double wait = open ? kReportAfterSeconds : 0;
    std::string note;
    if (const std::int64_t left_out = budget.report_due(now, wait); left_out > 0) {
      note += "cpprun-store-keeper: " + std::to_string(left_out) +
              " line(s) of the workers' store's log left out (LibTorch's store logs a stack trace for each "
              "malformed message a client sends it: is something other than the job's workers connecting to "
              "it?)\n";
    }
    if (not_taken > 0 && now - first_not_taken_s >= wait) {
      note += "cpprun-store-keeper: " + std::to_string(not_taken) +
              " byte(s) of the workers' store's log lost: the console took them more slowly than they came\n";
      not_taken = 0;
    }
    if (!note.empty()) write_line(console, note.data(), note.size());
  }
  close(from);
}

int original_stderr = -1;  // cpprun's console, for finish_relay and the terminate handler
std::thread relay_thread;
PipeBuffer pipe_buffer;
std::terminate_handler previous_terminate = nullptr;

// A keeper that ends abnormally says why on the console itself, not into a pipe nobody reads then.
[[noreturn]] void terminate_on_console() {
  if (original_stderr >= 0) dup2(original_stderr, STDERR_FILENO);  // std::cerr's buffer writes to fd 2
  if (previous_terminate != nullptr) previous_terminate();
  std::abort();
}

}  // namespace

void relay_stderr() {
  int ends[2];
  if (pipe2(ends, O_CLOEXEC) != 0) return;
  const int original = fcntl(STDERR_FILENO, F_DUPFD_CLOEXEC, 3);
  const int console = original >= 0 ? console_for_relay(original) : -1;
  // The writers never wait: a full pipe (1 MiB where the system allows) fails their writes instead.
  fcntl(ends[1], F_SETPIPE_SZ, 1 << 20);
  bool ready = console >= 0 && fcntl(ends[1], F_SETFL, O_NONBLOCK) == 0;
  if (ready) {  // the thread first: where it cannot start, stderr stays as it was
    try {
      relay_thread = std::thread([from = ends[0], console] {
        relay(from, console);
        close(console);
      });
    } catch (const std::system_error&) {
      ready = false;
    }
  }
  if (ready && dup2(ends[1], STDERR_FILENO) < 0) {
    close(ends[1]);  // the relay sees its only writer go, and ends
    relay_thread.join();
    if (original >= 0) close(original);
    return;
  }
  close(ends[1]);
  if (!ready) {
    close(ends[0]);
    if (console >= 0) close(console);
    if (original >= 0) close(original);
    return;
  }
  original_stderr = original;
  std::cerr.rdbuf(&pipe_buffer);
  std::clog.rdbuf(&pipe_buffer);
  previous_terminate = std::set_terminate(terminate_on_console);
}

void finish_relay() {
  if (!relay_thread.joinable()) return;
  std::cerr.flush();
  // stderr back to the console: the pipe loses its last writer, the relay writes what is left and ends.
  dup2(original_stderr, STDERR_FILENO);
  relay_thread.join();
}

}  // namespace cpprun::keeper
