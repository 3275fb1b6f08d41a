// DeviceMesh: a row-major layout of a group's ranks, with one subgroup per dimension.
#include "cpprun/device_mesh.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <functional>
#include <numeric>
#include <sstream>

#include "comm/group_membership.h"
#include "cpprun/object_collectives.h"

namespace cpprun {
namespace {

std::string joined(const std::vector<std::string>& names) {
  std::ostringstream out;
  for (std::size_t i = 0; i < names.size(); ++i) out << (i ? ", " : "") << '"' << names[i] << '"';
  return out.str();
}

std::string joined(const std::vector<int>& shape) { return "{" + c10::Join(", ", shape) + "}"; }

// Row-major index of `coordinates` over the dimensions `dims` (in that order) of `shape`.
int linear_index(const std::vector<int>& shape, const std::vector<int>& coordinates, const std::vector<int>& dims) {
  int index = 0;
  for (int d : dims) index = index * shape[d] + coordinates[d];
  return index;
}

// The dimensions of an n-d mesh other than those in `dims`, in order.
std::vector<int> other_dims(int n, const std::vector<int>& dims) {
  std::vector<int> others;
  for (int d = 0; d < n; ++d) {
    if (std::find(dims.begin(), dims.end(), d) == dims.end()) others.push_back(d);
  }
  return others;
}

}  // namespace

DeviceMesh::DeviceMesh(const ProcessGroup& group, std::vector<int> shape, std::vector<std::string> names)
    : whole_(detail::member_group("DeviceMesh", group)), shape_(std::move(shape)), names_(std::move(names)) {
  TORCH_CHECK(!shape_.empty(), "cpprun::DeviceMesh: the shape is empty; give one extent per dimension, e.g. {",
              group.size(), "}.");
  for (int extent : shape_) {
    TORCH_CHECK(extent > 0, "cpprun::DeviceMesh: shape ", joined(shape_), " has a dimension of ", extent,
                "; every dimension needs at least one rank.");
  }
  // In double: an int product wraps ({3, 1431655766} held "2" ranks and was accepted), and it is
  // exact up to 2^53, far past any group's size.
  const double ranks = std::accumulate(shape_.begin(), shape_.end(), 1.0, std::multiplies<double>());
  TORCH_CHECK(ranks == group.size(), "cpprun::DeviceMesh: shape ", joined(shape_), " holds ",
              ranks < 9e15 ? std::to_string(static_cast<int64_t>(ranks)) : std::to_string(ranks),
              " ranks but the group has ", group.size(), ".");
  if (names_.empty()) {
    for (std::size_t d = 0; d < shape_.size(); ++d) names_.push_back("dim" + std::to_string(d));
  }
  TORCH_CHECK(names_.size() == shape_.size(), "cpprun::DeviceMesh: ", names_.size(), " names (",
              joined(names_), ") for ", shape_.size(), " dimensions.");
  for (std::size_t d = 0; d < names_.size(); ++d) {
    for (std::size_t e = d + 1; e < names_.size(); ++e) {
      TORCH_CHECK(names_[d] != names_[e], "cpprun::DeviceMesh: dimensions ", d, " and ", e, " are both called \"",
                  names_[d], "\"; names must be distinct.");
    }
  }
  const int n = ndim();
  coordinates_.assign(n, 0);
  for (int d = n - 1, rest = group.rank(); d >= 0; --d) {
    coordinates_[d] = rest % shape_[d];
    rest /= shape_[d];
  }
  // Every rank must lay out the same mesh: a rank building {1, 2} beside one building {2, 1} (or
  // {2}), or naming the dimensions in another order, gets groups of other ranks than its peers
  // believe, and a collective on them hangs or pairs the wrong ranks with exit 0. Creation is
  // collective anyway (the splits below); one exchange of the layout first names the difference.
  const std::string layout = "shape " + joined(shape_) + ", names " + joined(names_);
  const std::vector<std::string> layouts = all_gather_bytes(group, layout);
  for (std::size_t r = 0; r < layouts.size(); ++r) {
    TORCH_CHECK(layouts[r] == layout, "cpprun::DeviceMesh: rank ", group.rank(), " builds the mesh of ", layout,
                ", rank ", r, " that of ", layouts[r], ". Every rank must build the same mesh (the same shape "
                "and names, in the same order).");
  }
  if (n == 1) {
    groups_ = {group};
    return;
  }
  // Along dimension d, the ranks that agree on every other coordinate: one split per dimension,
  // coloured by those other coordinates. Made on every rank, in this order: creation is collective.
  for (int d = 0; d < n; ++d) {
    groups_.push_back(split_group(group, /*colour=*/linear_index(shape_, coordinates_, other_dims(n, {d})),
                                  /*key=*/coordinates_[d]));
  }
}

DeviceMesh::DeviceMesh(ProcessGroup whole, std::vector<int> shape, std::vector<std::string> names,
                       std::vector<int> coordinates, std::vector<ProcessGroup> groups)
    : whole_(std::move(whole)),
      shape_(std::move(shape)),
      names_(std::move(names)),
      coordinates_(std::move(coordinates)),
      groups_(std::move(groups)) {}

DeviceMesh DeviceMesh::submesh(const std::vector<std::string>& names) const {
  TORCH_CHECK(!names.empty(), "cpprun::DeviceMesh::submesh: no dimension named; give some of ", joined(names_), ".");
  std::vector<int> dims;
  for (const auto& name : names) {
    const int d = dim_of(name);
    TORCH_CHECK(std::find(dims.begin(), dims.end(), d) == dims.end(), "cpprun::DeviceMesh::submesh: \"", name,
                "\" is named twice.");
    dims.push_back(d);
  }
  std::vector<int> shape, coordinates;
  std::vector<ProcessGroup> groups;
  for (int d : dims) {
    shape.push_back(shape_[d]);
    coordinates.push_back(coordinates_[d]);
    groups.push_back(groups_[d]);
  }
  // The ranks that agree on every dimension left out, ordered row-major over those kept (one
  // dimension: its group already is that).
  ProcessGroup whole = dims.size() == 1 ? groups_[dims[0]]
                                        : split_group(whole_, linear_index(shape_, coordinates_, other_dims(ndim(), dims)),
                                                      linear_index(shape_, coordinates_, dims));
  return DeviceMesh(std::move(whole), std::move(shape), names, std::move(coordinates), std::move(groups));
}

int DeviceMesh::dim_of(const std::string& name) const {
  for (std::size_t d = 0; d < names_.size(); ++d) {
    if (names_[d] == name) return static_cast<int>(d);
  }
  TORCH_CHECK(false, "cpprun::DeviceMesh: no dimension is called \"", name, "\"; this mesh's are ",
              joined(names_), ".");
}

int DeviceMesh::size(int dim) const {
  TORCH_CHECK(dim >= 0 && dim < ndim(), "cpprun::DeviceMesh: dimension ", dim, " of a ", ndim(), "-d mesh.");
  return shape_[dim];
}

int DeviceMesh::coordinate(int dim) const {
  size(dim);  // checks dim
  return coordinates_[dim];
}

const ProcessGroup& DeviceMesh::group(int dim) const {
  size(dim);
  return groups_[dim];
}

namespace {

std::string joined(const std::vector<int64_t>& shape) { return "{" + c10::Join(", ", shape) + "}"; }

// Note [init_device_mesh's refusals]: every check runs before any subgroup is made (these before
// the default group is joined, the world size's and the GPUs' after) and depends only on the
// arguments, the world size and the job-wide GPU vote, so a bad call throws on every rank alike
// and leaves no rank waiting in a collective.
void check_mesh_arguments(const std::string& device_type, const std::vector<int64_t>& shape,
                          const std::vector<std::string>& names) {
  // PyTorch's order: repeated names, then their count, then the device type.
  for (std::size_t d = 0; d < names.size(); ++d) {
    for (std::size_t e = d + 1; e < names.size(); ++e) {
      TORCH_CHECK(names[d] != names[e], "cpprun::init_device_mesh: mesh_dim_names (", joined(names),
                  ") name dimensions ", d, " and ", e, " both \"", names[d], "\"; each mesh_dim_name must be unique.");
    }
  }
  TORCH_CHECK(names.empty() || names.size() == shape.size(), "cpprun::init_device_mesh: ", names.size(),
              " mesh_dim_names (", joined(names), ") for the ", shape.size(), " dimensions of mesh_shape ",
              joined(shape), "; give one name per dimension, or none (then \"dim0\", \"dim1\", ...).");
  const bool letters_only = !device_type.empty() && std::all_of(device_type.begin(), device_type.end(), [](char c) {
    return std::isalpha(static_cast<unsigned char>(c));
  });
  TORCH_CHECK(letters_only, "cpprun::init_device_mesh: device_type \"", device_type, "\" is not a device type alone",
              device_type.find(':') != std::string::npos ? " (it has an index)" : "",
              ". Pass \"cpu\" or \"cuda\", e.g. cpprun::local_device().type(): each rank's device is then its own "
              "(cuda:LOCAL_RANK), as PyTorch, which refuses an index too.");
  TORCH_CHECK(device_type == "cpu" || device_type == "cuda", "cpprun::init_device_mesh: device_type \"", device_type,
              "\" is not one cpprun's process groups carry; pass \"cpu\" (Gloo) or \"cuda\" (NCCL, or Gloo).");
  TORCH_CHECK(!shape.empty(), "cpprun::init_device_mesh: mesh_shape is empty; give one size per dimension, e.g. "
              "{WORLD_SIZE} for a 1-D mesh (PyTorch would make a 0-d mesh of one rank).");
  for (std::size_t d = 0; d < shape.size(); ++d) {
    TORCH_CHECK(shape[d] > 0, "cpprun::init_device_mesh: mesh_shape ", joined(shape), " has size ", shape[d],
                " at dimension ", d, "; every dimension needs at least one rank.");
  }
}

}  // namespace

DeviceMesh init_device_mesh(const std::string& device_type, const std::vector<int64_t>& mesh_shape,
                            const std::vector<std::string>& mesh_dim_names) {
  check_mesh_arguments(device_type, mesh_shape, mesh_dim_names);
  // As PyTorch's _setup_world_group_and_device: the mesh is over the world, joined here if need be.
  if (!is_initialized()) init_process_group();
  const ProcessGroup world = default_group();
  // Every size is at least 1, so once the product passes the world it stays past it: stopping there
  // keeps it from overflowing.
  int64_t ranks = 1;
  for (int64_t size : mesh_shape) {
    ranks *= size;
    if (ranks > world.size()) break;
  }
  TORCH_CHECK(ranks <= world.size(), "cpprun::init_device_mesh: mesh_shape ", joined(mesh_shape),
              " needs more ranks than the world's ", world.size(), " (WORLD_SIZE); the product of the sizes must be ",
              world.size(), ". PyTorch refuses this too: \"Mesh should not be bigger than default world size\".");
  TORCH_CHECK(ranks == world.size(), "cpprun::init_device_mesh: mesh_shape ", joined(mesh_shape), " holds ", ranks,
              " of the world's ", world.size(), " ranks (WORLD_SIZE); the product of the sizes must be ", world.size(),
              ". PyTorch would leave ranks ", ranks, "..", world.size() - 1, " outside the mesh; for a mesh of some "
              "ranks only, make their group on every rank, g = cpprun::new_group(ranks), and on its members build "
              "cpprun::DeviceMesh(g, shape, names).");
  // local_device() after the join follows the job-wide vote: the same answer on every rank.
  TORCH_CHECK(device_type != "cuda" || local_device().is_cuda(), "cpprun::init_device_mesh: device_type \"cuda\", "
              "but not every rank of the job has a GPU of its own (cpprun::local_device() is ", local_device(),
              "); pass \"cpu\", or cpprun::local_device().type().");
  return DeviceMesh(world, std::vector<int>(mesh_shape.begin(), mesh_shape.end()), mesh_dim_names);
}

DeviceMesh init_device_mesh(c10::DeviceType device_type, const std::vector<int64_t>& mesh_shape,
                            const std::vector<std::string>& mesh_dim_names) {
  return init_device_mesh(c10::DeviceTypeName(device_type, /*lower_case=*/true), mesh_shape, mesh_dim_names);
}

DeviceMesh node_local_mesh() { return node_local_mesh(default_group()); }

DeviceMesh node_local_mesh(const ProcessGroup& group) {
  const int world = group.size();
  const int local = group.env().local_world_size;
  TORCH_CHECK(local > 0 && world % local == 0, "cpprun::node_local_mesh: WORLD_SIZE ", world,
              " is not a whole number of nodes of LOCAL_WORLD_SIZE ", local, " processes. Run the same "
              "number of processes on every node, or build DeviceMesh(group, shape) yourself.");
  return DeviceMesh(group, {world / local, local}, {"node", "local"});
}

DeviceMesh init_device_mesh() { return node_local_mesh(); }
DeviceMesh init_device_mesh(const ProcessGroup& group) { return node_local_mesh(group); }

}  // namespace cpprun
