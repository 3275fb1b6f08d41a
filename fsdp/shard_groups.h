// Which ranks FSDP shards over and which it replicates over. Plain FSDP shards over its whole
// group (or a 1-D mesh). HSDP (a 2-D mesh) shards over one mesh dimension and keeps a replica of
// each shard along the other: everything that cuts or gathers shards uses `shard`, gradients are
// averaged across `replicate` after their reduction in `shard`, and what must agree on every
// rank (the initial broadcast, failure agreement) uses `whole`.
#pragma once

#include <optional>
#include <string>

#include "cpprun/device_mesh.h"
#include "cpprun/process_group.h"

namespace cpprun::detail {

struct ShardGroups {
  ProcessGroup whole;
  ProcessGroup shard;
  std::optional<ProcessGroup> replicate;  // HSDP only

  // The ranks of one replica of the model: replica 0 alone writes sharded checkpoints.
  bool first_replica() const { return !replicate || replicate->rank() == 0; }
};

// From FSDP's group, or its mesh (then `group` is mesh.whole()); `shard_dim` names the mesh
// dimension to shard over (empty: the last).
ShardGroups make_shard_groups(const ProcessGroup& group, const std::optional<DeviceMesh>& mesh,
                              const std::string& shard_dim);

}  // namespace cpprun::detail
