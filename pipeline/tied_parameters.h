// Parameters that two or more pipeline stages share (GPT's head tied to its token embedding):
// found by identity in the unsplit model, pure, so that every rank finds the same ties in the
// same order. Ranks holding a tie sum its gradients after each step (schedule_runtime.cpp), so
// that their copies take the same optimizer step as the unsplit model's one tensor; clipping
// counts it once (pipeline_stage.cpp).
#pragma once

#include <string>
#include <vector>

namespace cpprun::detail {

struct TiedParameter {
  std::vector<int> stages;          // ascending; the first counts it in the norm
  std::vector<std::string> names;   // its name in each of those stages' modules
  std::string description;  // "stage 0's embed.weight, stage 3's head.weight"
};

struct StageTies {
  std::vector<TiedParameter> ties;
  std::vector<std::vector<int>> tie_of;  // [stage][parameter]: its tie, or -1
};

struct StageParameter {
  const void* identity;  // the tensor (its TensorImpl)
  std::string name;      // as the stage's module names it
};

// params[s]: stage s's parameters in the order its module lists them.
StageTies find_ties(const std::vector<std::vector<StageParameter>>& params);

}  // namespace cpprun::detail
