// TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT, read as torchrun reads it.
#include "command_line/uninterruptible_state_settings.h"

#include <cmath>
#include <cstddef>
#include <cstdlib>

namespace cpprun::launcher {

double resolve_uninterruptible_state_timeout(const std::optional<std::string>& raw) {
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


std::string uninterruptible_state_timeout_note(const std::optional<std::string>& raw) {
  if (!raw || raw->empty() || resolve_uninterruptible_state_timeout(raw) > 0) return "";
  return "cpprun: TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT='" + *raw +
         "' is not a number of seconds above 0: the D-state check is off, as torchrun leaves it (set e.g. 600, or "
         "unset it)";
}

}  // namespace cpprun::launcher
