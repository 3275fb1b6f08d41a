// Unit tests of line splitting (whole lines, bounded pieces, the unfinished last line) and the
// stderr tail.
#include "catch.h"

#include <string>
#include <vector>

#include "workers/worker_output.h"

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
