// FSDP's checkpoints. Full state: the wrapped module as torch::save writes it, rank 0 alone
// writing and reading. Sharded: each rank writes its own shards (and their optimizer state), in
// parallel; loading cuts the saved shards at the current world size's boundaries, so a
// checkpoint made on N ranks loads on M. Files are written atomically with a checksum
// (cpprun/checkpoint_file.h); a rank that fails tells the others (failure_agreement.h).
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <string>
#include <vector>

#include "cpprun/process_group.h"
#include "fsdp/flat_param.h"
#include "fsdp/shard_groups.h"

namespace cpprun::detail {

// Rank 0's parameters and buffers of `module` on every rank. Collective.
void broadcast_module_state(torch::nn::Module& module, const ProcessGroup& group);

// `module` with its full parameters current (gathered): rank 0 writes PATH. Collective.
void save_full_state(torch::nn::Module& module, const ProcessGroup& group, const std::string& path);
// Rank 0 reads PATH (a file torch::save or save_full_state wrote) into `module`'s full
// parameters and buffers, which are then broadcast; `flats`' separate shards are refreshed from
// them. The full parameters must be gathered. Collective.
void load_full_state(torch::nn::Module& module, std::vector<FlatParam>& flats, const ProcessGroup& group,
                     const std::string& path);

// DIR/rank_<r>.pt per shard rank r, then DIR/meta.pt from rank 0 once all are written (its
// presence marks a complete checkpoint). HSDP: replica 0 alone writes (the other replicas hold
// the same shards), so the files are those of plain FSDP over the shard group. `optimizer` may
// be null. Collective over groups.whole.
void save_sharded_checkpoint(const std::vector<FlatParam>& flats, const ShardGroups& groups,
                             torch::optim::Optimizer* optimizer, const std::string& dir);
// Fills the shards (and the optimizer's state for them) from DIR; under HSDP every replica
// reads its shards. Collective over groups.whole.
void load_sharded_checkpoint(const std::vector<FlatParam>& flats, const ShardGroups& groups,
                             torch::optim::Optimizer* optimizer, const std::string& dir);

}  // namespace cpprun::detail
