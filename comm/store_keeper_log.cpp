// The relay of Note [The keeper's log never stops the store] (store_keeper_log.h).
#include "comm/store_keeper_log.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <string>
#include <thread>

namespace cpprun::keeper {
namespace {

constexpr std::size_t kLongestLine = 16 * 1024;  // a longer one is cut into lines of this size
constexpr double kReportAfterSeconds = 2;
constexpr int kConsoleWaitMs = 200;  // for the rest of a line the console took in part

double seconds_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

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

// Writes all of `size` bytes; false where the console takes nothing for kConsoleWaitMs or fails.
bool write_whole(int fd, const char* data, std::size_t size) {
  while (size > 0) {
    const ssize_t wrote = write(fd, data, size);
    if (wrote > 0) {
      data += wrote;
      size -= static_cast<std::size_t>(wrote);
      continue;
    }
    if (wrote < 0 && errno == EINTR) continue;
    if (wrote < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
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
      if (budget.take(now) && !write_whole(console, pending.data() + start, end + 1 - start)) budget.left_out(now);
      start = end + 1;
    }
    pending.erase(0, start);
    const std::int64_t left_out = budget.report_due(now, open ? kReportAfterSeconds : 0);
    if (left_out > 0) {
      const std::string note = "cpprun-store-keeper: " + std::to_string(left_out) +
                               " line(s) of the workers' store's log left out (LibTorch's store logs a stack "
                               "trace for each malformed message a client sends it: is something other than the "
                               "job's workers connecting to it?)\n";
      write_whole(console, note.data(), note.size());
    }
  }
  close(from);
}

int original_stderr = -1;  // cpprun's console, for finish_relay
std::thread relay_thread;

}  // namespace

void relay_stderr() {
  int ends[2];
  if (pipe2(ends, O_CLOEXEC) != 0) return;
  const int original = fcntl(STDERR_FILENO, F_DUPFD_CLOEXEC, 3);
  const int console = original >= 0 ? console_for_relay(original) : -1;
  // The server's writes never wait: a full pipe (1 MiB where the system allows) fails them instead.
  fcntl(ends[1], F_SETPIPE_SZ, 1 << 20);
  const bool ready = console >= 0 && fcntl(ends[1], F_SETFL, O_NONBLOCK) == 0 && dup2(ends[1], STDERR_FILENO) >= 0;
  close(ends[1]);
  if (!ready) {
    close(ends[0]);
    if (console >= 0) close(console);
    if (original >= 0) close(original);
    return;
  }
  original_stderr = original;
  relay_thread = std::thread([from = ends[0], console] {
    relay(from, console);
    close(console);
  });
}

void finish_relay() {
  if (!relay_thread.joinable()) return;
  // stderr back to the console: the pipe loses its last writer, the relay writes what is left and ends.
  dup2(original_stderr, STDERR_FILENO);
  relay_thread.join();
}

}  // namespace cpprun::keeper
