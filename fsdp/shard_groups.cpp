// See shard_groups.h.
#include "fsdp/shard_groups.h"

#include <c10/util/Exception.h>

namespace cpprun::detail {

ShardGroups make_shard_groups(const ProcessGroup& group, const FsdpOptions& options) {
  if (!options.mesh()) {
    TORCH_CHECK(options.shard_dim().empty(), "cpprun::FullyShardedDataParallel: shard_dim(\"", options.shard_dim(),
                "\") names a mesh dimension, but no mesh was given; pass FsdpOptions().mesh(mesh) too.");
    return ShardGroups{group, group, std::nullopt};
  }
  const DeviceMesh& mesh = *options.mesh();
  TORCH_CHECK(mesh.ndim() == 2, "cpprun::FullyShardedDataParallel: HSDP needs a 2-D mesh (replicate x shard), got ",
              mesh.ndim(), " dimension(s); for plain FSDP over one dimension pass mesh.group(dim) as the group and ",
              "no mesh.");
  // The group's identity is not observable; its size and this rank's place in it are.
  TORCH_CHECK(mesh.whole().size() == group.size() && mesh.whole().rank() == group.rank(),
              "cpprun::FullyShardedDataParallel: the mesh was made from a group of ", mesh.whole().size(),
              " ranks (this rank ", mesh.whole().rank(), ") but FSDP was given one of ", group.size(), " (this rank ",
              group.rank(), "); pass mesh.whole() as FSDP's group (rank ", group.rank(), ").");
  const int shard_dim = options.shard_dim().empty() ? mesh.ndim() - 1 : mesh.dim_of(options.shard_dim());
  return ShardGroups{group, mesh.group(shard_dim), mesh.group(1 - shard_dim)};
}

}  // namespace cpprun::detail
