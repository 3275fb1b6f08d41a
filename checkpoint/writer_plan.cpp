// See writer_plan.h.
#include "checkpoint/writer_plan.h"

#include <c10/util/Exception.h>

#include <algorithm>

#include "support/safetensors_index.h"

namespace cpprun::detail {

std::vector<std::vector<int>> writers_of_pieces(const std::vector<std::uint64_t>& name_bytes,
                                                const std::vector<std::size_t>& piece_of_name, std::size_t pieces,
                                                int writers) {
  TORCH_INTERNAL_ASSERT(name_bytes.size() == piece_of_name.size() && writers > 0);
  // Run r of the partition is file r + 1, which writer r writes (state_dict_shard).
  const std::vector<int> run = partition_by_bytes(name_bytes, writers);
  std::vector<std::vector<int>> out(pieces);
  for (std::size_t i = 0; i < run.size(); ++i) {
    TORCH_INTERNAL_ASSERT(piece_of_name[i] < pieces);
    std::vector<int>& of = out[piece_of_name[i]];
    if (std::find(of.begin(), of.end(), run[i]) == of.end()) of.push_back(run[i]);
  }
  for (auto& of : out) std::sort(of.begin(), of.end());
  return out;
}

}  // namespace cpprun::detail
