// "did you mean --nproc_per_node?" for a mistyped option. Pure, so unit-tested.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace cpprun::launcher {

// Edits (insert, delete, substitute, swap two neighbours) that turn `a` into `b`.
std::size_t edit_distance(const std::string& a, const std::string& b);

// The known option (spelled with its dashes, e.g. "--log_dir") closest to `typed`, if it is close
// enough to be what the user meant: a few edits away for a long name, one for a short one, or
// `typed` cut short ("--nproc" for "--nproc_per_node"). Ties go to the earlier name in `known`.
std::optional<std::string> suggest_option(const std::string& typed, const std::vector<std::string>& known);

}  // namespace cpprun::launcher
