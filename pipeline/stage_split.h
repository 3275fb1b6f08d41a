// Checking a pipeline split against the model's children: pure, on names only, so that every
// mistake a user can make in a split is unit-tested (pipeline_stage.cpp applies the result).
#pragma once

#include <string>
#include <vector>

namespace cpprun::detail {

// The children [first, first + count) of the model that make up one stage.
struct StageRange {
  int first = 0;
  int count = 0;
};

// One range per stage, or throws (c10::Error) naming what is wrong with `split` and how to fix it:
// no stages, a stage count the ranks do not divide, an empty stage, a name that is no child
// (listing the children), a child in two stages or twice in one, a child in no stage (the
// uneven split that drops the last layers), children out of the model's order.
std::vector<StageRange> check_split(const std::vector<std::string>& children,
                                    const std::vector<std::vector<std::string>>& split, int ranks);

// `count` children in `stages` contiguous runs, the first count % stages runs one longer.
std::vector<StageRange> even_ranges(int count, int stages);

}  // namespace cpprun::detail
