// Who writes what in a sharded save (checkpoint/sharded_state_dict.h): the same plan as the
// files' (each name in the file of its run of partition_by_bytes, run r written by writer r),
// decided from the tensors' sizes alone, before any is gathered, so that a whole tensor is made
// only on the writers that write it (checkpoint/writer_gather.h). Pure: no collective.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace cpprun::detail {

// `name_bytes[i]`: the bytes of the i-th name of the state dict, in its order; `piece_of_name[i]`:
// the tensor it names (a tied tensor is one piece under several names), < `pieces`. Returns, for
// each piece, the writers (0 .. writers-1) whose file holds one of its names, ascending; a piece
// no name refers to has none.
std::vector<std::vector<int>> writers_of_pieces(const std::vector<std::uint64_t>& name_bytes,
                                                const std::vector<std::size_t>& piece_of_name, std::size_t pieces,
                                                int writers);

}  // namespace cpprun::detail
