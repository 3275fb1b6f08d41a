// The store keeper's log on its way to cpprun's console (Note [The keeper's log never stops the
// store]). Part of cpprun-store-keeper alone; LogLineBudget is header-only so that the unit tests
// check its decisions without the relay's I/O.
#pragma once

#include <algorithm>
#include <cstdint>

namespace cpprun::keeper {

// Note [The keeper's log never stops the store]: LibTorch's TCPStore server logs a stack trace,
// about 17 lines, for every malformed message a peer sends, from the thread that serves every
// client. Written straight to cpprun's stderr, a stranger's flood filled the console (3.4 MB in
// 6 s), and once that stderr stopped being read the server thread blocked in write() and the job's
// own workers waited on their store until they timed out (an audit, 2026-12-07). So the keeper's
// stderr is a pipe of its own whose writes never block (a full pipe drops them, counted; std::cerr
// writes through a buffer that never turns the stream bad), and a thread relays it to the console:
// a burst of lines, then a trickle, the rest counted and named in one line. Where the console is a
// pipe or terminal the relay's writes do not block either: a line the console takes none of now
// is left out (counted) and the relay goes on reading. A terminate puts stderr back on the console
// first, so that an abnormal end is still told.

// Which lines pass: `burst` at once, then `per_second` a second on average; the others are counted
// so that one line can say how many were left out.
class LogLineBudget {
 public:
  LogLineBudget(double burst, double per_second) : burst_(burst), per_second_(per_second), tokens_(burst) {}

  // Whether a line that arrives at `now_s` (seconds from any fixed origin, never decreasing) passes.
  bool take(double now_s) {
    if (last_s_ >= 0) tokens_ = std::min(burst_, tokens_ + (now_s - last_s_) * per_second_);
    last_s_ = now_s;
    if (tokens_ >= 1) {
      tokens_ -= 1;
      return true;
    }
    left_out(now_s);
    return false;
  }
  // A line that passed but could not be written (a console that takes nothing now) counts as left out.
  void left_out(double now_s) {
    if (left_out_ == 0) first_left_out_s_ = now_s;
    ++left_out_;
  }
  // How many lines were left out, once `report_after_s` has passed since the first of them (then
  // counting starts again); 0 before, or when none was.
  std::int64_t report_due(double now_s, double report_after_s) {
    if (left_out_ == 0 || now_s - first_left_out_s_ < report_after_s) return 0;
    const std::int64_t count = left_out_;
    left_out_ = 0;
    return count;
  }

 private:
  double burst_, per_second_, tokens_;
  double last_s_ = -1;
  double first_left_out_s_ = 0;
  std::int64_t left_out_ = 0;
};

// Points this process's stderr at a pipe relayed to the stderr it had, as the Note says, through
// LogLineBudget(kBurstLines, kLinesPerSecond). Call before anything logs. Best effort: where a step
// fails, stderr stays as it was.
inline constexpr double kBurstLines = 40;
inline constexpr double kLinesPerSecond = 0.5;
void relay_stderr();
// stderr back to the console it was, once the relay has written what it holds: before the keeper
// exits other than by std::_Exit (its own error message goes through the relay too).
void finish_relay();

}  // namespace cpprun::keeper
