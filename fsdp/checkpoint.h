// FSDP's sharded checkpoints (the full state is checkpoint/full_state.h's): each rank writes its own
// rows of every parameter (and their optimizer state) under the parameter's name, in parallel;
// loading cuts the saved rows at the current world size's boundaries, so a checkpoint made on N
// ranks loads on M, whatever the units were. Files are written atomically with a checksum
// (cpprun/checkpoint_file.h); a rank that fails tells the others (core/failure_agreement.h).
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <string>
#include <vector>

#include "cpprun/process_group.h"
#include "fsdp/param_bucket.h"
#include "fsdp/shard_groups.h"

namespace cpprun::detail {

// DIR/rank_<r>.pt per shard rank r, then DIR/meta.pt from rank 0 once all are written (its
// presence marks a complete checkpoint); every file records the save's id (rank 0's draw). HSDP:
// replica 0 alone writes (the other replicas hold the same shards), so the files are those of
// plain FSDP over the shard group. `optimizer` may be null. Collective over groups.whole; when
// any rank fails, each removes the file it wrote and meta.pt is not written.
void save_sharded_checkpoint(const std::vector<ParamBucket>& buckets, const ShardGroups& groups,
                             torch::optim::Optimizer* optimizer, const std::string& dir);
// Fills the shards (and the optimizer's state for them) from DIR; under HSDP every replica
// reads its shards. A file whose save id differs from meta.pt's (files of two saves; one with an
// id and one without) is refused on every rank alike, naming it (CorruptCheckpointError);
// files of earlier versions, none with an id, load. Collective over groups.whole.
void load_sharded_checkpoint(const std::vector<ParamBucket>& buckets, const ShardGroups& groups,
                             torch::optim::Optimizer* optimizer, const std::string& dir);

}  // namespace cpprun::detail
