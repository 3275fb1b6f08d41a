// The launcher's stdout and stderr as its workers' output reaches them: written without blocking,
// so that a console nobody reads (`cpprun ... | less` left open, a stalled log shipper, a terminal
// stopped by Ctrl-S) cannot stop the event loop that reaps workers, relays signals and answers
// the other nodes. See Note [A console that does not read].
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <string_view>

namespace cpprun::launcher {

// Note [A console that does not read]
// Workers write into pipes the launcher reads; the launcher copies their lines to its console.
// A blocking write to a console that takes nothing held the whole launcher: a failed worker was
// not noticed, SIGTERM not acted on, other nodes not answered, until someone read. torchrun's
// workers write to the console themselves, so there only the workers wait. Here the lines wait in
// the sink, which writes what the console takes whenever poll() says it can (a pipe or terminal
// takes up to PIPE_BUF bytes then without blocking); past kBacklogLimit the launcher stops reading
// the workers' pipes, so a worker that keeps printing waits in its own write(), as torchrun's
// would, while the launcher goes on supervising. A regular file is written at once, as before.
// The launcher's own messages (a failure's summary) are written to stderr directly: behind a
// backlog they come before worker lines still waiting, and a stalled stderr holds them.
class ConsoleSink {
 public:
  // Above this many bytes waiting, the workers' pipes are left unread until the console takes some.
  static constexpr std::size_t kBacklogLimit = 1 << 20;

  explicit ConsoleSink(int fd);
  ~ConsoleSink();
  ConsoleSink(const ConsoleSink&) = delete;
  ConsoleSink& operator=(const ConsoleSink&) = delete;

  // The process's own: stdout and stderr. Flushed at exit (flush_before_exit) by an atexit handler.
  static ConsoleSink& out();
  static ConsoleSink& err();

  // What to poll() for POLLOUT while there is a backlog.
  int poll_fd() const { return own_fd_ >= 0 ? own_fd_ : fd_; }
  // Appends `data` and writes what the console takes now, without waiting.
  void write(std::string_view data);
  // poll() said the console can take more: writes what it takes now.
  void write_ready();
  std::size_t backlog() const { return pending_.size() - written_; }
  // The memory the sink holds: its backlog, plus written bytes not yet cut from the front.
  std::size_t held_bytes() const { return pending_.size(); }
  bool accepts_more() const { return backlog() < kBacklogLimit; }
  // Waits for the console to take the backlog, giving up once it takes nothing for `patience`;
  // returns the bytes dropped then (said on stderr at exit, for stdout).
  std::size_t flush_before_exit(std::chrono::milliseconds patience);

 private:
  // Writes while the console takes more; false when it would block (a backlog is left).
  bool write_while_ready();

  int fd_;
  int own_fd_ = -1;            // fd_'s pipe or terminal, reopened non-blocking; -1: a file or a socket
  bool regular_file_ = false;  // written at once: a disk does not stall on a reader
  bool broken_ = false;        // an error other than "would block": the rest is dropped
  std::string pending_;
  std::size_t written_ = 0;  // of pending_
};

}  // namespace cpprun::launcher
