// tensor_parallel_splits (cpprun/tensor_parallel_split.h): the split parameters of every
// TensorParallelModule in a module tree, by dotted name.
#include "core/tensor_parallel_splits.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <sstream>

namespace cpprun {

std::map<std::string, TensorParallelSplit> tensor_parallel_splits(torch::nn::Module& module) {
  std::map<std::string, TensorParallelSplit> splits;
  auto note = [&](const std::string& prefix, torch::nn::Module& m) {
    const auto* tp = dynamic_cast<const TensorParallelModule*>(&m);
    if (!tp) return;
    for (auto& [name, split] : tp->tensor_parallel_splits()) {
      TORCH_CHECK(split.parts >= 1, "cpprun: the tensor-parallel module ", m.name(), " (", prefix, name,
                  ") says its parameter is split in ", split.parts, " parts; parts must be at least 1.");
      splits.emplace(prefix + name, std::move(split));
    }
  };
  note("", module);
  for (const auto& item : module.named_modules(std::string(), /*include_self=*/false)) {
    note(item.key() + ".", *item.value());
  }
  return splits;
}

namespace detail {

std::vector<ProcessGroup> distinct_groups(const std::vector<const ProcessGroup*>& groups,
                                          std::vector<int64_t>* index_of) {
  std::vector<std::vector<int>> ranks;
  ranks.reserve(groups.size());
  std::map<std::vector<int>, int64_t> position;  // by ranks: the same order on every rank
  for (const ProcessGroup* group : groups) {
    ranks.push_back(get_process_group_ranks(*group));
    position.emplace(ranks.back(), 0);
  }
  std::vector<ProcessGroup> distinct;
  for (auto& [group_ranks, index] : position) {
    index = static_cast<int64_t>(distinct.size());
    for (size_t i = 0; i < groups.size(); ++i) {
      if (ranks[i] == group_ranks) {
        distinct.push_back(*groups[i]);
        break;
      }
    }
  }
  if (index_of) {
    index_of->clear();
    for (const auto& group_ranks : ranks) index_of->push_back(position.at(group_ranks));
  }
  return distinct;
}

void refuse_tensor_parallel_overlap(const std::map<std::string, TensorParallelSplit>& splits,
                                    const ProcessGroup& data_parallel, const char* who) {
  const std::vector<int> dp_ranks = get_process_group_ranks(data_parallel);
  if (splits.empty() || dp_ranks.empty()) return;
  const int me = dp_ranks.at(static_cast<std::size_t>(data_parallel.rank()));
  for (const auto& [name, split] : splits) {
    const std::vector<int> tp_ranks = get_process_group_ranks(split.group);
    for (int r : dp_ranks) {
      if (r == me || std::find(tp_ranks.begin(), tp_ranks.end(), r) == tp_ranks.end()) continue;
      std::ostringstream ranks;
      for (std::size_t i = 0; i < tp_ranks.size(); ++i) ranks << (i ? ", " : "") << tp_ranks[i];
      TORCH_CHECK(false, who, ": its data-parallel group holds rank ", r, ", which is in the same tensor-parallel "
                  "group as this rank (ranks ", ranks.str(), ", splitting \"", name, "\"): the two hold different "
                  "shards under one name, and averaging or sharding across them would mix them. Give the wrapper "
                  "the data-parallel dimension only: with a {dp, tp} DeviceMesh, mesh.group(\"dp\").");
    }
  }
}

std::vector<ProcessGroup> tensor_parallel_groups(const std::map<std::string, TensorParallelSplit>& splits) {
  std::vector<const ProcessGroup*> groups;
  for (const auto& [name, split] : splits) groups.push_back(&split.group);
  return distinct_groups(groups);
}

}  // namespace detail
}  // namespace cpprun
