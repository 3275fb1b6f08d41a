// See shard_groups.h.
#include "fsdp/shard_groups.h"

#include <c10/util/Exception.h>

namespace cpprun::detail {

ShardGroups make_shard_groups(const ProcessGroup& group, const std::optional<DeviceMesh>& mesh,
                              const std::string& shard_dim) {
  if (!mesh) {
    TORCH_CHECK(shard_dim.empty(), "cpprun::FullyShardedDataParallel: shard_dim(\"", shard_dim, "\") names a mesh "
                "dimension, but FSDP was given a group; pass the DeviceMesh itself: FullyShardedDataParallel(net, mesh, "
                "options).");
    return ShardGroups{group, group, std::nullopt};
  }
  TORCH_CHECK(mesh->ndim() == 1 || mesh->ndim() == 2, "cpprun::FullyShardedDataParallel: a mesh of 1 dimension (FSDP) "
              "or 2 (HSDP: replicate x shard) was expected, got ", mesh->ndim(), ".");
  if (mesh->ndim() == 1) {
    if (!shard_dim.empty()) mesh->dim_of(shard_dim);  // a name the mesh lacks: an error listing its names
    return ShardGroups{group, mesh->group(0), std::nullopt};
  }
  const int dim = shard_dim.empty() ? mesh->ndim() - 1 : mesh->dim_of(shard_dim);
  return ShardGroups{group, mesh->group(dim), mesh->group(1 - dim)};
}

}  // namespace cpprun::detail
