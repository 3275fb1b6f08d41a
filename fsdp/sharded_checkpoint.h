// Sharded checkpoints: each rank writes its own shards (and their optimizer state), in parallel;
// loading cuts the saved shards at the current world size's boundaries, so a checkpoint made on
// N ranks loads on M.
#pragma once

#include <torch/optim/optimizer.h>

#include <string>
#include <vector>

#include "cpprun/process_group.h"
#include "fsdp/flat_param.h"

namespace cpprun::detail {

// DIR/rank_<r>.pt per rank, then DIR/meta.pt from rank 0 once all are written (its presence
// marks a complete checkpoint). `optimizer` may be null. Collective.
void save_sharded_checkpoint(const std::vector<FlatParam>& flats, const ProcessGroup& group,
                             torch::optim::Optimizer* optimizer, const std::string& dir);
// Fills the shards (and the optimizer's state for them) from DIR. Collective.
void load_sharded_checkpoint(const std::vector<FlatParam>& flats, const ProcessGroup& group,
                             torch::optim::Optimizer* optimizer, const std::string& dir);

}  // namespace cpprun::detail
