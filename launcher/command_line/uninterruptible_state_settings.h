// What TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT and --monitor_interval ask of the workers' watch
// (workers/uninterruptible_watch.h). Apart from it because the command line fills it in and may not
// include workers/.
#pragma once

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <optional>
#include <string>

namespace cpprun::launcher {

struct UninterruptibleStateSettings {
  // Seconds a worker may stay in uninterruptible sleep (Linux D state) before the attempt is ended
  // as unhealthy, without a restart. 0: the check is off (torchrun's default).
  double timeout_s = 0;
  // How often the workers' /proc/PID/stat is read while the check is on: --monitor_interval.
  std::chrono::milliseconds interval{100};
  bool enabled() const { return timeout_s > 0; }
};

// TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT as torchrun 2.15 resolves it
// (local_elastic_agent.py _resolve_uninterruptible_state_timeout): unset, empty, not a number
// (Python's float(): surrounding blanks allowed, "inf" and "nan" too) or not positive: 0, off. Pure.
inline double resolve_uninterruptible_state_timeout(const std::optional<std::string>& raw) {
  if (!raw || raw->empty()) return 0;
  // Python takes "1_000" (an underscore between digits) and refuses hexadecimal, strtod the reverse.
  std::string text;
  for (std::size_t i = 0; i < raw->size(); ++i) {
    const char c = (*raw)[i];
    if (c == 'x' || c == 'X') return 0;
    if (c == '_') {
      const auto digit = [&](std::size_t j) { return j < raw->size() && (*raw)[j] >= '0' && (*raw)[j] <= '9'; };
      if (i == 0 || !digit(i - 1) || !digit(i + 1)) return 0;
      continue;
    }
    text += c;
  }
  const char* begin = text.c_str();
  char* end = nullptr;
  const double value = std::strtod(begin, &end);
  if (end == begin) return 0;
  while (*end == ' ' || *end == '\t' || *end == '\n' || *end == '\r' || *end == '\f' || *end == '\v') ++end;
  if (*end != '\0') return 0;
  // float("nan") passes, and max(0.0, nan) is 0.0 in Python: off. "inf" stays: never times out.
  return std::isnan(value) || value <= 0 ? 0 : value;
}

}  // namespace cpprun::launcher
