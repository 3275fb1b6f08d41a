// Long-option prefixes, the way argparse's allow_abbrev reads them.
#include "command_line/option_prefix.h"

#include "command_line/launch_config.h"

namespace cpprun::launcher {
namespace {

const OptionSpelling* exact(const std::string& name, const std::vector<OptionSpelling>& options) {
  for (const OptionSpelling& o : options) {
    if (o.name == name) return &o;
  }
  return nullptr;
}

// The first matching spelling of each option that `name` is a prefix of, in declaration order.
std::vector<const OptionSpelling*> prefixed(const std::string& name, const std::vector<OptionSpelling>& options) {
  std::vector<const OptionSpelling*> found;
  for (const OptionSpelling& o : options) {
    if (o.name.rfind(name, 0) != 0) continue;
    bool seen = false;
    for (const OptionSpelling* f : found) seen = seen || f->option == o.option;
    if (!seen) found.push_back(&o);
  }
  return found;
}

}  // namespace

std::vector<std::string> expand_option_prefixes(const std::vector<std::string>& args,
                                                const std::vector<OptionSpelling>& options) {
  std::vector<std::string> out = args;
  for (std::size_t i = 0; i < out.size(); ++i) {
    const std::string& arg = out[i];
    if (arg == "--" || arg.size() < 2 || arg[0] != '-') break;
    const auto eq = arg.find('=');
    const std::string name = arg.substr(0, eq);
    const OptionSpelling* option = exact(name, options);
    // "--" alone is no prefix, and short options (-r) are not abbreviated, as in argparse.
    if (option == nullptr && name.rfind("--", 0) == 0 && name.size() > 2) {
      const std::vector<const OptionSpelling*> found = prefixed(name, options);
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
    if (option == nullptr && name[1] != '-' && exact(name.substr(0, 2), options) != nullptr) {
      continue;  // a short option with its value attached: -r3
    }
    if (option == nullptr) break;  // PROGRAM's flags never get here; CLI11 names the unknown option
    if (option->takes_value && eq == std::string::npos) ++i;
  }
  return out;
}

}  // namespace cpprun::launcher
