// pipeline/stage_names.h: a stage's checkpoint names under its prefixes.
#include "pipeline/stage_names.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <set>

namespace cpprun::detail {
namespace {

// A module path: dot-separated, no component empty. `to` may be empty itself (the rest alone).
bool is_path(const std::string& path) {
  if (path.empty() || path.front() == '.' || path.back() == '.') return false;
  return path.find("..") == std::string::npos;
}

}  // namespace

NamePrefixes checked_prefixes(NamePrefixes prefixes) {
  std::set<std::string> froms;
  for (const auto& [from, to] : prefixes) {
    TORCH_CHECK(is_path(from), "PipelineStage::set_state_dict_prefixes: \"", from,
                "\" (to \"", to, "\") is not a module path of the stage: give dot-separated child names, "
                "e.g. \"h3.block\".");
    TORCH_CHECK(to.empty() || is_path(to), "PipelineStage::set_state_dict_prefixes: \"", from, "\" to \"", to,
                "\": the new prefix must be a module path (e.g. \"transformer.h.3\") or empty.");
    TORCH_CHECK(froms.insert(from).second, "PipelineStage::set_state_dict_prefixes: \"", from,
                "\" is given twice; give each path one new prefix.");
  }
  // Longest first, so that "h3.block" wins over "h3"; stable for equal lengths (distinct anyway).
  std::stable_sort(prefixes.begin(), prefixes.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  return prefixes;
}

std::string renamed(const NamePrefixes& prefixes, const std::string& name) {
  for (const auto& [from, to] : prefixes) {
    if (name.size() <= from.size() || name.compare(0, from.size(), from) != 0 || name[from.size()] != '.') continue;
    const std::string rest = name.substr(from.size() + 1);
    return to.empty() ? rest : to + "." + rest;
  }
  return name;
}

}  // namespace cpprun::detail
