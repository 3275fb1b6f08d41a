// See formatting.h.
#include "common/formatting.h"

#include <algorithm>

namespace cpprun::launcher {

std::string decimal_seconds(std::chrono::milliseconds ms) {
  std::string fraction = std::to_string(ms.count() % 1000 + 1000).substr(1);  // "050" for 1.05 s
  fraction.erase(fraction.find_last_not_of('0') + 1);
  return std::to_string(ms.count() / 1000) + (fraction.empty() ? "" : "." + fraction);
}

std::string shell_quote(const std::string& word) {
  const bool plain = !word.empty() && word.find_first_not_of(
                                          "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                          "0123456789_-+=./:,@%") == std::string::npos;
  if (plain) return word;
  std::string quoted = "'";
  for (char c : word) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

std::string printable(std::string text) {
  std::replace_if(text.begin(), text.end(), [](unsigned char c) { return c < 0x20 || c == 0x7f; }, '?');
  return text;
}

}  // namespace cpprun::launcher
