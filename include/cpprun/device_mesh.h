// A DeviceMesh: the ranks of a group laid out as an N-dimensional array with named dimensions,
// and for each dimension the subgroup of ranks that differ only along it (as
// torch.distributed.device_mesh). For hybrid sharding, a {nodes, gpus_per_node} mesh shards
// within a node (group("local")) and replicates across nodes (group("node")); 3-D parallelism
// lays pipelines, data parallelism and tensor parallelism out as {pp, dp, tp}.
//
//   auto mesh = cpprun::init_device_mesh("cpu", {2, 4}, {"dp", "tp"});  // PyTorch's, over the world
//   auto hosts = cpprun::node_local_mesh();           // {NNODES, LOCAL_WORLD_SIZE}: "node", "local"
//   auto mesh2 = cpprun::DeviceMesh(group, {2, 4}, {"replicate", "shard"});
//   cpprun::all_reduce(mesh2.group("replicate"), t);  // the 2 ranks holding the same shard
//   cpprun::DeviceMesh mesh3(group, {2, 2, 2}, {"pp", "dp", "tp"});
//   cpprun::DeviceMesh dp_tp = mesh3.submesh({"dp", "tp"});  // PyTorch's mesh3["dp", "tp"]
#pragma once

#include <c10/core/DeviceType.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cpprun/process_group.h"

namespace cpprun {

class DeviceMesh {
 public:
  // Ranks of `group` row-major over `shape` (the product must be group.size()): in a {R, S}
  // mesh rank = r * S + s, in a {P, D, T} mesh rank = (p * D + d) * T + t. `names` (default
  // "dim0", "dim1", ...) must be distinct. Collective over `group`: every rank constructs the
  // same mesh (it creates one subgroup per dimension, in dimension order).
  DeviceMesh(const ProcessGroup& group, std::vector<int> shape, std::vector<std::string> names = {});

  int ndim() const { return static_cast<int>(shape_.size()); }
  const std::vector<int>& shape() const { return shape_; }
  const std::vector<std::string>& names() const { return names_; }
  int size(int dim) const;
  int size(const std::string& name) const { return size(dim_of(name)); }
  // This rank's index along a dimension.
  int coordinate(int dim) const;
  int coordinate(const std::string& name) const { return coordinate(dim_of(name)); }
  // The ranks that share this rank's coordinates in every other dimension; its rank there is
  // coordinate(dim).
  const ProcessGroup& group(int dim) const;
  const ProcessGroup& group(const std::string& name) const { return group(dim_of(name)); }
  // The group the mesh was made from.
  const ProcessGroup& whole() const { return whole_; }
  // The dimension called `name`; throws listing the names when there is none.
  int dim_of(const std::string& name) const;
  // PyTorch's names for the same (torch.distributed.device_mesh.DeviceMesh): get_group(dim),
  // get_local_rank(dim) (this rank's coordinate), mesh_dim_names(), size() the ranks of the whole
  // mesh, get_rank() this process's rank in the job (the world's, as PyTorch's, not whole()'s),
  // get_coordinate() every coordinate.
  const ProcessGroup& get_group(int dim) const { return group(dim); }
  const ProcessGroup& get_group(const std::string& name) const { return group(name); }
  int get_local_rank(int dim) const { return coordinate(dim); }
  int get_local_rank(const std::string& name) const { return coordinate(name); }
  const std::vector<std::string>& mesh_dim_names() const { return names(); }
  int size() const { return whole_.size(); }
  int get_rank() const { return cpprun::rank(); }
  const std::vector<int>& get_coordinate() const { return coordinates_; }
  // The mesh of the dimensions `names` (in that order) through this rank, the others held at
  // this rank's coordinates: PyTorch's mesh["dp", "tp"]. Its per-dimension groups are this
  // mesh's; its whole() is a new group of the ranks it holds. Collective over whole(): every rank
  // asks for the same names, in the same order as its other submesh() calls.
  DeviceMesh submesh(const std::vector<std::string>& names) const;

 private:
  DeviceMesh(ProcessGroup whole, std::vector<int> shape, std::vector<std::string> names, std::vector<int> coordinates,
             std::vector<ProcessGroup> groups);

  ProcessGroup whole_;
  std::vector<int> shape_;
  std::vector<std::string> names_;
  std::vector<int> coordinates_;
  std::vector<ProcessGroup> groups_;
};

// torch.distributed.device_mesh.init_device_mesh: the world (the default group, which it
// initialises with init_process_group() when there is none yet) laid out row-major over
// `mesh_shape`, its dimensions named `mesh_dim_names` (none: "dim0", "dim1", ...). Refused, on
// every rank and before any communication, as PyTorch refuses them: repeated names, a names count
// other than the shape's, a device type with an index ("cuda:0"; pass the type alone, e.g.
// cpprun::local_device().type()), a mesh bigger than the world. Also refused, where PyTorch
// differs (docs/process_groups.md, "DeviceMesh"): a size below 1 (an assertion in PyTorch), an
// empty shape (a 0-d mesh in PyTorch), a mesh smaller than the world (PyTorch leaves the other
// ranks outside it; build DeviceMesh over new_group(ranks) for that), a device type other than
// cpu or cuda, and cuda where not every rank has a GPU of its own. The device type picks no
// backend: the groups carry cpu and cuda tensors, as the default group does. Collective over the
// world, as DeviceMesh's constructor.
DeviceMesh init_device_mesh(const std::string& device_type, const std::vector<int64_t>& mesh_shape,
                            const std::vector<std::string>& mesh_dim_names = {});
DeviceMesh init_device_mesh(c10::DeviceType device_type, const std::vector<int64_t>& mesh_shape,
                            const std::vector<std::string>& mesh_dim_names = {});

// A {nodes, processes per node} mesh of `group` (default: the default group) named "node" and
// "local", from WORLD_SIZE and LOCAL_WORLD_SIZE as the launcher set them (every node must run
// the same number of processes, as cpprun and torchrun do): hybrid sharding's layout, with no
// shape to give. PyTorch has no such function (its users write init_device_mesh("cuda",
// (nnodes, nproc_per_node), ...)).
DeviceMesh node_local_mesh();
DeviceMesh node_local_mesh(const ProcessGroup& group);

// node_local_mesh()'s old names: init_device_mesh is PyTorch's name for a mesh of a given shape
// (above), so these will go.
[[deprecated("cpprun::init_device_mesh() with no shape is cpprun::node_local_mesh(); PyTorch's "
             "init_device_mesh(device_type, mesh_shape, mesh_dim_names) takes a shape")]]
DeviceMesh init_device_mesh();
[[deprecated("cpprun::init_device_mesh(group) is cpprun::node_local_mesh(group); PyTorch's "
             "init_device_mesh(device_type, mesh_shape, mesh_dim_names) takes a shape")]]
DeviceMesh init_device_mesh(const ProcessGroup& group);

}  // namespace cpprun
