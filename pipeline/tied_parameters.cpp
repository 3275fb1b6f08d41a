// See tied_parameters.h.
#include "pipeline/tied_parameters.h"

#include <map>

namespace cpprun::detail {

StageTies find_ties(const std::vector<std::vector<StageParameter>>& params) {
  // Every stage each tensor appears in, in order of first appearance.
  std::map<const void*, std::vector<std::pair<int, std::string>>> holders;
  std::vector<const void*> order;
  for (int s = 0; s < static_cast<int>(params.size()); ++s) {
    for (const auto& p : params[s]) {
      auto& list = holders[p.identity];
      if (list.empty()) order.push_back(p.identity);
      if (list.empty() || list.back().first != s) list.emplace_back(s, p.name);
    }
  }
  StageTies result;
  std::map<const void*, int> tie_index;
  for (const void* identity : order) {
    const auto& list = holders.at(identity);
    if (list.size() < 2) continue;
    TiedParameter tie;
    for (const auto& [stage, name] : list) {
      tie.stages.push_back(stage);
      tie.names.push_back(name);
      tie.description += (tie.description.empty() ? "" : ", ") + ("stage " + std::to_string(stage) + "'s " + name);
    }
    tie_index[identity] = static_cast<int>(result.ties.size());
    result.ties.push_back(std::move(tie));
  }
  for (const auto& stage : params) {
    std::vector<int> of;
    for (const auto& p : stage) {
      auto it = tie_index.find(p.identity);
      of.push_back(it == tie_index.end() ? -1 : it->second);
    }
    result.tie_of.push_back(std::move(of));
  }
  return result;
}

}  // namespace cpprun::detail
