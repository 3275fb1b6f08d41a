// See stage_split.h.
#include "pipeline/stage_split.h"

#include <c10/util/Exception.h>

#include <map>
#include <sstream>

namespace cpprun::detail {

namespace {

std::string listed(const std::vector<std::string>& names) {
  std::ostringstream out;
  for (size_t i = 0; i < names.size(); ++i) out << (i ? ", " : "") << '"' << names[i] << '"';
  return out.str();
}

}  // namespace

std::vector<StageRange> check_split(const std::vector<std::string>& children,
                                    const std::vector<std::vector<std::string>>& split, int ranks) {
  const int stages = static_cast<int>(split.size());
  TORCH_CHECK(stages > 0, "PipelineStage: the split has no stages; give one list of child names per stage.");
  TORCH_CHECK(ranks > 0 && stages % ranks == 0, "PipelineStage: the split has ", stages,
              " stages, which the pipeline group's ", ranks,
              " ranks do not divide; give one stage per rank (or the same number of stages to every rank, for an "
              "interleaved schedule).");
  std::map<std::string, int> position;
  for (size_t i = 0; i < children.size(); ++i) position[children[i]] = static_cast<int>(i);
  std::map<std::string, int> stage_of;
  std::vector<StageRange> ranges;
  for (int s = 0; s < stages; ++s) {
    TORCH_CHECK(!split[s].empty(), "PipelineStage: stage ", s, " of the split has no children; every stage needs at least one.");
    for (const auto& name : split[s]) {
      TORCH_CHECK(position.count(name), "PipelineStage: stage ", s, " names \"", name,
                  "\", which is not a child of the model; its children are ", listed(children), ".");
      auto [it, inserted] = stage_of.emplace(name, s);
      TORCH_CHECK(inserted, "PipelineStage: \"", name, "\" is in stage ", it->second,
                  it->second == s ? " twice" : (" and in stage " + std::to_string(s)),
                  "; every child belongs to exactly one stage.");
    }
  }
  for (const auto& name : children) {
    TORCH_CHECK(stage_of.count(name), "PipelineStage: the model's child \"", name,
                "\" is in no stage, so the split model would skip it; add it to a stage (an uneven split that "
                "leaves the last children out is the usual cause). The children are ",
                listed(children), ".");
  }
  int next = 0;
  for (int s = 0; s < stages; ++s) {
    for (size_t k = 0; k < split[s].size(); ++k) {
      const auto& name = split[s][k];
      TORCH_CHECK(position.at(name) == next, "PipelineStage: stage ", s, " lists \"", name, "\" where the model's order has \"",
                  children[next], "\"; stages run one after another, so the split must list the children in the "
                  "model's order, each stage a contiguous run.");
      ++next;
    }
    ranges.push_back({next - static_cast<int>(split[s].size()), static_cast<int>(split[s].size())});
  }
  return ranges;
}

std::vector<StageRange> even_ranges(int count, int stages) {
  TORCH_CHECK(stages > 0 && count >= stages, "split_evenly: cannot cut ", count, " children into ", stages,
              " stages; each stage needs at least one child.");
  std::vector<StageRange> ranges;
  int first = 0;
  for (int s = 0; s < stages; ++s) {
    const int size = count / stages + (s < count % stages ? 1 : 0);
    ranges.push_back({first, size});
    first += size;
  }
  return ranges;
}

}  // namespace cpprun::detail
