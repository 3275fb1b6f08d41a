// DeviceMesh: a row-major layout of a group's ranks, with one subgroup per dimension.
#include "cpprun/device_mesh.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <functional>
#include <numeric>
#include <sstream>

namespace cpprun {
namespace {

std::string joined(const std::vector<std::string>& names) {
  std::ostringstream out;
  for (std::size_t i = 0; i < names.size(); ++i) out << (i ? ", " : "") << '"' << names[i] << '"';
  return out.str();
}

std::string joined(const std::vector<int>& shape) { return "{" + c10::Join(", ", shape) + "}"; }

}  // namespace

DeviceMesh::DeviceMesh(const ProcessGroup& group, std::vector<int> shape, std::vector<std::string> names)
    : whole_(group), shape_(std::move(shape)), names_(std::move(names)) {
  TORCH_CHECK(shape_.size() == 1 || shape_.size() == 2, "cpprun::DeviceMesh: shape ", joined(shape_),
              " has ", shape_.size(), " dimensions; 1 or 2 are supported.");
  for (int extent : shape_) {
    TORCH_CHECK(extent > 0, "cpprun::DeviceMesh: shape ", joined(shape_), " has a dimension of ", extent,
                "; every dimension needs at least one rank.");
  }
  const int ranks = std::accumulate(shape_.begin(), shape_.end(), 1, std::multiplies<int>());
  TORCH_CHECK(ranks == group.size(), "cpprun::DeviceMesh: shape ", joined(shape_), " holds ", ranks,
              " ranks but the group has ", group.size(), ".");
  TORCH_CHECK(group.is_member(), "cpprun::DeviceMesh: this process is not a member of the group.");
  if (names_.empty()) {
    for (std::size_t d = 0; d < shape_.size(); ++d) names_.push_back("dim" + std::to_string(d));
  }
  TORCH_CHECK(names_.size() == shape_.size(), "cpprun::DeviceMesh: ", names_.size(), " names (",
              joined(names_), ") for ", shape_.size(), " dimensions.");
  TORCH_CHECK(names_.size() == 1 || names_[0] != names_[1], "cpprun::DeviceMesh: both dimensions are called \"",
              names_[0], "\"; names must be distinct.");
  if (shape_.size() == 1) {
    coordinates_ = {group.rank()};
    groups_ = {group};
    return;
  }
  const int columns = shape_[1];
  coordinates_ = {group.rank() / columns, group.rank() % columns};
  // Along dim 0 the ranks of one column (same coordinate 1); along dim 1 those of one row.
  // Both splits are made on every rank, in this order: creation is collective.
  groups_.push_back(split_group(group, /*colour=*/coordinates_[1], /*key=*/coordinates_[0]));
  groups_.push_back(split_group(group, /*colour=*/coordinates_[0], /*key=*/coordinates_[1]));
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

DeviceMesh init_device_mesh() { return init_device_mesh(default_group()); }

DeviceMesh init_device_mesh(const ProcessGroup& group) {
  const int world = group.size();
  const int local = group.env().local_world_size;
  TORCH_CHECK(local > 0 && world % local == 0, "cpprun::init_device_mesh: WORLD_SIZE ", world,
              " is not a whole number of nodes of LOCAL_WORLD_SIZE ", local, " processes. Run the same "
              "number of processes on every node, or build DeviceMesh(group, shape) yourself.");
  return DeviceMesh(group, {world / local, local}, {"node", "local"});
}

}  // namespace cpprun
