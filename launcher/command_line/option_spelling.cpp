// Long-option prefixes the way argparse's allow_abbrev reads them; the closest option to a typo by
// optimal-string-alignment distance.
#include "command_line/option_spelling.h"

#include <algorithm>
#include <cstddef>
#include <utility>

#include "command_line/launch_config.h"

namespace cpprun::launcher {
namespace {

const OptionSpelling* exact(const std::string& name, const std::vector<OptionSpelling>& options) {
  const auto found = std::find_if(options.begin(), options.end(), [&](const auto& o) { return o.name == name; });
  return found == options.end() ? nullptr : &*found;
}

// The first matching spelling of each option that `name` is a prefix of, in declaration order;
// torchrun's spellings only if `torchrun_only`.
std::vector<const OptionSpelling*> prefixed(const std::string& name, const std::vector<OptionSpelling>& options,
                                            bool torchrun_only = false) {
  std::vector<const OptionSpelling*> found;
  for (const OptionSpelling& o : options) {
    const auto same_option = [&](const OptionSpelling* f) { return f->option == o.option; };
    if (torchrun_only && !o.torchrun) continue;
    if (o.name.rfind(name, 0) == 0 && std::none_of(found.begin(), found.end(), same_option)) found.push_back(&o);
  }
  return found;
}

// argparse's test for a word that is an option, not a value (ArgumentParser._parse_optional): a
// dash and more, but not a negative number (-1, -.5, -1.5: argparse's ^-\d+$|^-\d*\.\d+$, read as
// values while no option looks like one) and, unless it is one of ours, no word with a space in it
// (--log_line_prefix_template "- ${rank} -").
bool looks_like_option(const std::string& word, const std::vector<OptionSpelling>& options) {
  if (word.size() < 2 || word[0] != '-') return false;
  const std::string name = word.substr(0, word.find('='));
  if (exact(name, options) != nullptr || (name.rfind("--", 0) == 0 && !prefixed(name, options).empty())) return true;
  const auto digits = [](const std::string& text) {
    return !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
  };
  const std::string rest = word.substr(1);
  const std::size_t dot = rest.find('.');
  const bool negative_number = dot == std::string::npos ? digits(rest)
                                                        : (dot == 0 || digits(rest.substr(0, dot))) &&
                                                              digits(rest.substr(dot + 1));
  return !negative_number && word.find(' ') == std::string::npos;
}

// "N|auto|cpu|gpu" as "N, auto, cpu or gpu".
std::string value_choices(const std::string& value_name) {
  std::vector<std::string> choices;
  for (std::size_t start = 0;;) {
    const std::size_t bar = value_name.find('|', start);
    choices.push_back(value_name.substr(start, bar == std::string::npos ? std::string::npos : bar - start));
    if (bar == std::string::npos) break;
    start = bar + 1;
  }
  std::string text;
  for (std::size_t i = 0; i < choices.size(); ++i) {
    text += (i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ") + choices[i];
  }
  return text;
}

std::string without_dashes(const std::string& name) {
  const auto start = name.find_first_not_of('-');
  return start == std::string::npos ? std::string() : name.substr(start);
}

}  // namespace

std::vector<std::string> expand_option_prefixes(const std::vector<std::string>& args,
                                                const std::vector<OptionSpelling>& options) {
  std::vector<std::string> out = args;
  for (std::size_t i = 0; i < out.size(); ++i) {
    const std::string typed = out[i];  // out[i] itself may be written out in full below
    const std::string& arg = out[i];
    if (arg == "--" || arg.size() < 2 || arg[0] != '-') break;
    const auto eq = arg.find('=');
    const std::string name = arg.substr(0, eq);
    const OptionSpelling* option = exact(name, options);
    // "--" alone is no prefix, and short options (-r) are not abbreviated, as in argparse.
    if (option == nullptr && name.rfind("--", 0) == 0 && name.size() > 2) {
      std::vector<const OptionSpelling*> found = prefixed(name, options);
      // A prefix torchrun's argparse takes for one of its options means that option here too,
      // whatever cpprun's own options and aliases also start with: else a command line that runs
      // under torchrun would be refused (--re=0, --run_, --no-).
      if (found.size() > 1) {
        std::vector<const OptionSpelling*> torchrun = prefixed(name, options, true);
        if (torchrun.size() == 1) found = std::move(torchrun);
      }
      if (found.size() > 1) {
        std::string list;
        for (const OptionSpelling* f : found) list += (list.empty() ? "" : ", ") + f->name;
        throw UsageError("ambiguous option " + name + ": it could be " + list +
                         "; write more of it\nRun with --help for more information.");
      }
      if (found.size() == 1) {
        option = found.front();
        out[i] = option->name + (eq == std::string::npos ? std::string() : arg.substr(eq));
      }
    }
    if (option == nullptr && name[1] != '-' && exact(name.substr(0, 2), options)) continue;  // -r3: value attached
    if (option == nullptr) break;  // PROGRAM's flags never get here; CLI11 names the unknown option
    if (!option->takes_value && eq != std::string::npos) {
      // argparse: "ignored explicit argument 'train.py'"; CLI11 would try to read it as a boolean.
      const std::string value = typed.substr(eq + 1);
      throw UsageError(option->name + " is a flag and takes no value (" + typed + " was given); write " +
                       option->name + " alone" +
                       (value.empty() ? "" : " (if '" + value + "' is PROGRAM: " + option->name + " " + value + ")") +
                       "\nRun with --help for more information.");
    }
    if (option->takes_value && eq == std::string::npos && i + 1 == out.size()) {
      // argparse: "expected one argument"; CLI11's "1 required TYPE missing" reads as a riddle.
      throw UsageError(option->name + " expects a value" +
                       (option->value_name.empty() ? "" : " (" + value_choices(option->value_name) + ")") +
                       ": write " + option->name + "=VALUE, then PROGRAM\nRun with --help for more information.");
    }
    if (option->takes_value && eq != std::string::npos && out[i].find('=') + 1 == out[i].size()) {
      // --log_dir= is an empty value, as argparse reads it; CLI11 would take the next argument
      // (PROGRAM itself) as the value. Given separately, "" is a value CLI11 keeps.
      out[i].pop_back();
      out.insert(out.begin() + static_cast<std::ptrdiff_t>(i) + 1, std::string());
      ++i;
      continue;
    }
    if (option->takes_value && name.size() == 2 && name[1] != '-' && eq == 2) {
      // -r=3: argparse splits a short option at '=' too (-r 3); CLI11 would read the value "=3".
      out[i] = name + out[i].substr(eq + 1);
      continue;
    }
    if (option->takes_value && eq == std::string::npos) {
      // "--log-dir --redirects=3 ./train": argparse refuses the option as the value; CLI11 would
      // take it (a log dir named "--redirects=3", and no redirects).
      if (i + 1 < out.size() && looks_like_option(out[i + 1], options)) {
        throw UsageError("argument " + name + ": expected one argument (the next word, " + out[i + 1] +
                         ", is an option; give " + name + " its value: " + name + " VALUE or " + name +
                         "=VALUE)\nRun with --help for more information.");
      }
      ++i;
    }
  }
  return out;
}

std::size_t edit_distance(const std::string& a, const std::string& b) {
  // d[i][j]: distance between a's first i and b's first j characters.
  std::vector<std::vector<std::size_t>> d(a.size() + 1, std::vector<std::size_t>(b.size() + 1));
  for (std::size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (std::size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    for (std::size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      const bool swapped = i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1];
      if (swapped) d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.size()][b.size()];
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
