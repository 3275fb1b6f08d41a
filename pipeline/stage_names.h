// The names a pipeline stage's tensors are checkpointed under (PipelineStage::
// set_state_dict_prefixes): pure, on names only, so that every rule is unit-tested.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace cpprun::detail {

using NamePrefixes = std::vector<std::pair<std::string, std::string>>;  // (from, to)

// `prefixes` checked and ordered longest `from` first, or throws (c10::Error) naming the entry:
// an empty `from`, a path with an empty component ("a..b", ".a", "a."), a `to` with one, a
// `from` given twice.
NamePrefixes checked_prefixes(NamePrefixes prefixes);

// `name` with its longest leading module path among `prefixes` (checked_prefixes' order)
// replaced: "h3.block.attn.w" under {"h3.block", "transformer.h.3"} is "transformer.h.3.attn.w";
// a path matches whole components only ("h3" is no prefix of "h30.w"). No match: `name` itself.
std::string renamed(const NamePrefixes& prefixes, const std::string& name);

}  // namespace cpprun::detail
