// Optimal-string-alignment distance and the closest-option rule.
#include "command_line/option_suggestion.h"

#include <algorithm>

namespace cpprun::launcher {
namespace {

std::string without_dashes(const std::string& name) {
  const auto start = name.find_first_not_of('-');
  return start == std::string::npos ? std::string() : name.substr(start);
}

}  // namespace

std::size_t edit_distance(const std::string& a, const std::string& b) {
  // d[i][j]: distance between a's first i and b's first j characters, three rows kept.
  std::vector<std::size_t> before(b.size() + 1), previous(b.size() + 1), current(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) previous[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    current[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t substitute = previous[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      current[j] = std::min({previous[j] + 1, current[j - 1] + 1, substitute});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        current[j] = std::min(current[j], before[j - 2] + 1);
      }
    }
    before.swap(previous);
    previous.swap(current);
  }
  return previous[b.size()];
}

std::optional<std::string> suggest_option(const std::string& typed, const std::vector<std::string>& known) {
  const std::string body = without_dashes(typed);
  if (body.size() < 2) return std::nullopt;  // "-x" is no typo of "-h"
  // One edit per three letters, at least one and at most three: "--bogus" is nobody's typo.
  const std::size_t allowed = std::clamp<std::size_t>(body.size() / 3, 1, 3);
  std::optional<std::string> best;
  std::size_t best_distance = allowed + 1;
  for (const std::string& name : known) {
    const std::string name_body = without_dashes(name);
    std::size_t distance = edit_distance(typed, name);
    // An abbreviation, which argparse (so torchrun) would even accept.
    if (body.size() >= 3 && name_body.size() > body.size() && name_body.compare(0, body.size(), body) == 0) {
      distance = std::min<std::size_t>(distance, 1);
    }
    if (distance < best_distance) {
      best = name;
      best_distance = distance;
    }
  }
  return best;
}

}  // namespace cpprun::launcher
