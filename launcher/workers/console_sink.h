// The launcher's stdout and stderr as its workers' output reaches them: written without blocking,
// so that a console nobody reads (`cpprun ... | less` left open, a stalled log shipper, a terminal
// stopped by Ctrl-S) cannot stop the event loop that reaps workers, relays signals and answers
// the other nodes. See Note [A console that does not read].
#pragma once

#include <poll.h>

#include <chrono>
#include <cstddef>
#include <deque>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

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
//
// Note [The launcher's own lines]
// cpprun's own messages (std::cerr: a failure's summary, restarts, notes) go through the stderr
// sink too (route_stderr_through_sink(), from main()): behind a backlog they come after the worker
// lines written before them, as on torchrun's console, and a stalled stderr no longer holds the
// launcher in a blocking write. None may be lost where it was printed before:
// - every exit through exit() (main's return included) flushes both sinks (an atexit handler),
//   waiting while the console takes something, up to kExitPatience without progress; then the
//   workers' bytes still waiting are dropped, and the launcher's own lines still waiting get one
//   more try of the same patience, written ahead of them: a console that takes anything takes
//   the fatal message;
// - std::terminate flushes the stderr sink the same way before the default handler runs;
// - after the exit flush, and from any thread but main()'s (the file timer's), std::cerr is
//   written straight to fd 2, as before (the sink is not thread-safe; those lines are rare);
// - the waits outside the workers' loop (SignalRelay::wait_until, the rendezvous' poll) keep
//   writing the backlog (ConsoleWait), so a restart's or a rendezvous' lines do not sit there.
// Forked children never flush (they _exit or exec), so nothing is written twice.
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
  // The same for the launcher's own lines, which flush_before_exit() writes even when it gives up
  // on the workers' bytes around them.
  void write_own(std::string_view data);
  // poll() said the console can take more: writes what it takes now.
  void write_ready();
  std::size_t backlog() const { return pending_.size() - written_; }
  // The memory the sink holds: its backlog, plus written bytes not yet cut from the front.
  std::size_t held_bytes() const { return pending_.size(); }
  bool accepts_more() const { return backlog() < kBacklogLimit; }
  // Waits for the console to take the backlog, giving up once it takes nothing for `patience`;
  // then the launcher's own lines still waiting get `patience` more. Returns the bytes dropped
  // (said on stderr at exit, for stdout), not counting own lines that got through.
  std::size_t flush_before_exit(std::chrono::milliseconds patience);

 private:
  // Writes while the console takes more; false when it would block (a backlog is left).
  bool write_while_ready();
  // Drops bytes written from the front of the buffer and own lines wholly written.
  void forget_written();
  // At exit: `text` ahead of everything, waiting up to `patience` without progress; the bytes left.
  std::size_t write_within(const std::string& text, std::chrono::milliseconds patience);

  int fd_;
  int own_fd_ = -1;            // fd_'s pipe or terminal, reopened non-blocking; -1: a file or a socket
  bool regular_file_ = false;  // written at once: a disk does not stall on a reader
  bool broken_ = false;        // an error other than "would block": the rest is dropped
  bool at_line_start_ = true;  // the last byte written ended a line
  std::string pending_;
  std::size_t written_ = 0;  // of pending_
  // Bytes ever appended and ever written (or dropped), and the launcher's own lines not yet
  // wholly written, each with its offset in that count: Note [The launcher's own lines].
  unsigned long long appended_ = 0;
  unsigned long long delivered_ = 0;
  std::deque<std::pair<unsigned long long, std::string>> own_;
};

// Sends std::cerr through ConsoleSink::err(): Note [The launcher's own lines]. Once, from main().
void route_stderr_through_sink();

// For a poll() that waits for something else: the consoles with a backlog, polled for writing, and
// written to when they take more.
class ConsoleWait {
 public:
  // Appends POLLOUT entries for the consoles with a backlog to `fds`; how many.
  std::size_t add(std::vector<pollfd>& fds);
  // After the poll(): writes what each ready console takes.
  void after(const std::vector<pollfd>& fds) const;

 private:
  std::size_t first_ = 0;
  std::vector<ConsoleSink*> sinks_;
};

}  // namespace cpprun::launcher
