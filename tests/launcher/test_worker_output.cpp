// Unit tests of line splitting (whole lines, bounded pieces, the unfinished last line), the
// stderr tail, and the console sink that never blocks.
#include "catch.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "workers/console_sink.h"
#include "workers/worker_output.h"
#include "workers/worker_process.h"

using namespace cpprun::launcher;

namespace {

struct Collected {
  std::vector<std::string> lines;
  LineSplitter::LineSink sink() {
    return [this](std::string_view line) { lines.emplace_back(line); };
  }
};

}  // namespace

TEST_CASE("worker_output: hands out whole lines however the bytes arrive", "[worker_output]") {
  LineSplitter splitter;
  Collected got;
  splitter.feed("al", got.sink());
  CHECK(got.lines.empty());
  splitter.feed("pha\nbe", got.sink());
  splitter.feed("ta\n\ngam", got.sink());
  splitter.feed("ma\n", got.sink());
  CHECK(got.lines == std::vector<std::string>{"alpha", "beta", "", "gamma"});
  CHECK_FALSE(splitter.has_partial_line());
}

TEST_CASE("worker_output: finish() hands out the unfinished last line once", "[worker_output]") {
  LineSplitter splitter;
  Collected got;
  splitter.feed("done\nno newline", got.sink());
  CHECK(splitter.has_partial_line());
  splitter.finish(got.sink());
  splitter.finish(got.sink());
  CHECK(got.lines == std::vector<std::string>{"done", "no newline"});
}

TEST_CASE("worker_output: an over-long line comes out in pieces of the maximum size", "[worker_output]") {
  LineSplitter splitter(4);
  Collected got;
  splitter.feed("abcdefghij", got.sink());  // no newline yet: full pieces only
  CHECK(got.lines == std::vector<std::string>{"abcd", "efgh"});
  splitter.feed("k\nwxyz\n12", got.sink());  // a line of exactly the maximum is one piece
  CHECK(got.lines == std::vector<std::string>{"abcd", "efgh", "ijk", "wxyz"});
  splitter.feed("345", got.sink());
  splitter.finish(got.sink());
  CHECK(got.lines == std::vector<std::string>{"abcd", "efgh", "ijk", "wxyz", "1234", "5"});
}

TEST_CASE("worker_output: each piece says whether it starts a line", "[worker_output]") {
  LineSplitter splitter(4);
  std::vector<std::string> got;
  const LineSplitter::LineSink sink = [&](std::string_view piece) {
    got.push_back((splitter.piece_starts_line() ? "^" : "+") + std::string(piece));
  };
  splitter.feed("abcdefghij", sink);       // two pieces of one line
  splitter.feed("k\nwxyz\n1234", sink);    // its end; a whole line; a piece of the next
  splitter.feed("5\n67", sink);
  splitter.finish(sink);                   // the unfinished last line starts a line
  CHECK(got == std::vector<std::string>{"^abcd", "+efgh", "+ijk", "^wxyz", "^1234", "+5", "^67"});
}

TEST_CASE("worker_output: the default maximum is 64 KiB", "[worker_output]") {
  LineSplitter splitter;
  Collected got;
  splitter.feed(std::string(64 * 1024 + 10, 'x'), got.sink());
  REQUIRE(got.lines.size() == 1);
  CHECK(got.lines[0].size() == 64 * 1024);
}

TEST_CASE("worker_output: the tail keeps the last lines, each cut short", "[worker_output]") {
  LineTail tail(3, 5);
  for (const char* line : {"one", "two", "three", "four", "a very long line"}) tail.push(line);
  CHECK(tail.lines() == std::vector<std::string>{"three", "four", "a ver [...]"});
  LineTail none(0);
  none.push("x");
  CHECK(none.lines().empty());
}

// Note [A console that does not read]: a pipe nobody reads takes what fits, the rest waits in
// the sink without blocking the caller; once read, the sink writes the rest, in order.
TEST_CASE("worker_output: a console that does not read never blocks the launcher", "[worker_output]") {
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  ConsoleSink sink(fds[1]);
  std::string sent;
  for (int i = 0; sent.size() < 3 * ConsoleSink::kBacklogLimit; ++i) {
    const std::string line = "line " + std::to_string(i) + std::string(100, 'x') + "\n";
    sink.write(line);  // returns at once although the pipe (64 KiB) filled long ago
    sent += line;
  }
  CHECK(sink.backlog() > 2 * ConsoleSink::kBacklogLimit);
  CHECK_FALSE(sink.accepts_more());
  // A reader appears: what it reads, with the sink writing whenever the pipe has room, is every
  // byte in order.
  std::string received;
  char buffer[65536];
  while (received.size() < sent.size()) {
    const ssize_t n = read(fds[0], buffer, sizeof(buffer));
    REQUIRE(n > 0);
    received.append(buffer, static_cast<std::size_t>(n));
    sink.write_ready();
  }
  CHECK(received == sent);
  CHECK(sink.backlog() == 0);
  CHECK(sink.accepts_more());
  // A reader slower than the writer, but reading: the sink's memory stays near the backlog limit
  // (it grew by every byte that ever passed through before).
  std::size_t most_held = 0;
  for (int round = 0; round < 4000; ++round) {
    if (sink.accepts_more()) {  // as the launcher: the workers' pipes read only then
      sink.write(std::string(4000, 'z'));
      continue;
    }
    const ssize_t n = read(fds[0], buffer, 3000);
    REQUIRE(n > 0);
    sink.write_ready();
    most_held = std::max(most_held, sink.held_bytes());
  }
  CHECK(most_held < 2 * ConsoleSink::kBacklogLimit + 65536);
  while (read(fds[0], buffer, sizeof(buffer)) == static_cast<ssize_t>(sizeof(buffer)) || sink.backlog() > 0) {
    sink.write_ready();
  }
  // At exit, a reader that never comes costs `patience`, then the rest is dropped and counted.
  sink.write(std::string(200000, 'y'));
  const auto start = std::chrono::steady_clock::now();
  const std::size_t dropped = sink.flush_before_exit(std::chrono::milliseconds(300));
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(waited >= 0.29);
  CHECK(waited < 5);
  CHECK(dropped > 0);
  CHECK(dropped < 200000);  // the pipe took what it holds
  CHECK(sink.backlog() == 0);
  close(fds[0]);
  close(fds[1]);
}

// Note [The launcher's own lines]: behind a backlog they come after the workers' bytes written before
// them; at exit, when the console took nothing for the patience, the workers' bytes still waiting are
// dropped and the launcher's own lines get one more try, ahead of them, on a line of their own.
TEST_CASE("worker_output: the launcher's own lines keep their place, and at exit go ahead of the dropped bytes",
          "[worker_output]") {
  const auto read_all = [](int fd) {
    std::string received;
    char buffer[65536];
    for (ssize_t n; (n = read(fd, buffer, sizeof(buffer))) > 0;) received.append(buffer, static_cast<std::size_t>(n));
    return received;
  };
  {
    int fds[2];
    REQUIRE(pipe(fds) == 0);
    std::string received;
    std::thread reader;
    {
      ConsoleSink sink(fds[1]);
      const std::string workers(200000, 'a');
      sink.write(workers);
      sink.write_own("cpprun: rank 1 failed first\n");
      sink.write("b\n");
      reader = std::thread([&] { received = read_all(fds[0]); });
      CHECK(sink.flush_before_exit(std::chrono::seconds(5)) == 0);
    }  // the sink's own descriptor of the pipe closed
    close(fds[1]);
    reader.join();
    CHECK(received == std::string(200000, 'a') + "cpprun: rank 1 failed first\nb\n");
    close(fds[0]);
  }
  {
    int fds[2];
    REQUIRE(pipe(fds) == 0);
    std::string received;
    std::size_t dropped = 0;
    std::thread reader;
    {
      ConsoleSink sink(fds[1]);
      sink.write(std::string(300000, 'y'));  // no newline: a line cut by the drop
      sink.write_own("cpprun: exiting with code 3\n");
      sink.write(std::string(1000, 'z'));
      // The reader comes after the first patience (2 s), well within the second: a second's margin
      // each way, for a loaded machine that runs this thread late (it was 0.3 s before the first).
      reader = std::thread([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(3000));
        received = read_all(fds[0]);
      });
      dropped = sink.flush_before_exit(std::chrono::milliseconds(2000));
    }
    close(fds[1]);
    reader.join();
    const std::string own = "\ncpprun: exiting with code 3\n";
    REQUIRE(received.size() > own.size());
    CHECK(received.substr(received.size() - own.size()) == own);
    CHECK(received.find('z') == std::string::npos);
    CHECK(dropped == 300000 + 1000 - (received.size() - own.size()));
    close(fds[0]);
  }
}

// Before close_range(CLOSE_RANGE_CLOEXEC) (Linux 5.11), a worker's child marks the descriptors
// /proc/self/fd lists rather than every number up to the launcher's raised limit (2^20 fcntl calls
// a worker): each listed one from `first` on, none below it.
TEST_CASE("worker_output: the descriptors /proc/self/fd lists are made close-on-exec from the first asked",
          "[worker_output]") {
  std::vector<int> fds;
  for (int i = 0; i < 4; ++i) {
    int pair[2];
    REQUIRE(pipe(pair) == 0);  // without O_CLOEXEC
    fds.push_back(pair[0]);
    fds.push_back(pair[1]);
  }
  std::sort(fds.begin(), fds.end());
  const int first = fds[3];
  const auto cloexec = [](int fd) { return (fcntl(fd, F_GETFD) & FD_CLOEXEC) != 0; };
  for (int fd : fds) REQUIRE_FALSE(cloexec(fd));
  REQUIRE(cpprun::launcher::mark_listed_descriptors_cloexec(first));
  for (int fd : fds) {
    INFO("descriptor " << fd << ", the first asked " << first);
    CHECK(cloexec(fd) == (fd >= first));
  }
  for (int fd : fds) close(fd);
}
