// DeviceMesh under `cpprun --nproc_per_node=K`, K = 1..4: each dimension's group holds the
// ranks that differ only along it (2-d and every 3-d shape of the world), a submesh holds the
// ranks that agree on the dimensions left out, names and shapes are checked, init_device_mesh lays
// the world out as PyTorch's and refuses what it refuses, and node_local_mesh follows the
// launcher's WORLD_SIZE / LOCAL_WORLD_SIZE, with or without a group given.
#include "catch.h"
#include <ATen/ATen.h>

#include <algorithm>
#include <functional>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "cpprun/cpprun.h"
#include "cpprun/device_mesh.h"
#include "dist_test_support.h"

using dist_test::group;

TEST_CASE("device mesh: a 2-d mesh's groups are its rows and columns", "[mesh]") {
  const int world = group().size(), rank = group().rank();
  const int rows = world % 2 == 0 ? 2 : 1, columns = world / rows;
  cpprun::DeviceMesh mesh(group(), {rows, columns}, {"replicate", "shard"});
  CHECK(mesh.ndim() == 2);
  CHECK(mesh.size("replicate") == rows);
  CHECK(mesh.coordinate("replicate") == rank / columns);
  CHECK(mesh.coordinate("shard") == rank % columns);
  CHECK(mesh.group("shard").rank() == rank % columns);
  CHECK(mesh.group("replicate").rank() == rank / columns);
  // PyTorch's names for the same.
  CHECK(mesh.get_local_rank("shard") == rank % columns);
  CHECK(mesh.get_local_rank(0) == rank / columns);
  CHECK(&mesh.get_group("shard") == &mesh.group("shard"));
  CHECK(&mesh.get_group(0) == &mesh.group(0));
  CHECK(mesh.mesh_dim_names() == std::vector<std::string>{"replicate", "shard"});
  CHECK(mesh.size() == world);
  CHECK(mesh.get_rank() == rank);
  CHECK(mesh.get_coordinate() == std::vector<int>{rank / columns, rank % columns});
  // Sum of ranks along each dimension.
  at::Tensor along_rows = at::full({1}, rank, at::kLong), along_columns = at::full({1}, rank, at::kLong);
  cpprun::all_reduce(mesh.group("shard"), along_rows);        // my row: r*C .. r*C+C-1
  cpprun::all_reduce(mesh.group("replicate"), along_columns);  // my column: c, c+C, ...
  const int row = rank / columns, column = rank % columns;
  int64_t row_sum = 0, column_sum = 0;
  for (int c = 0; c < columns; ++c) row_sum += row * columns + c;
  for (int r = 0; r < rows; ++r) column_sum += r * columns + column;
  CHECK(along_rows.item<int64_t>() == row_sum);
  CHECK(along_columns.item<int64_t>() == column_sum);

  CHECK_THROWS_WITH(mesh.group("tp"), Catch::Contains("\"replicate\", \"shard\""));
  CHECK_THROWS_WITH(cpprun::DeviceMesh(group(), {world + 1}), Catch::Contains("holds " + std::to_string(world + 1)));
  CHECK_THROWS_WITH(cpprun::DeviceMesh(group(), {1, world, 1}, {"pp", "dp", "pp"}),
                    Catch::Contains("dimensions 0 and 2 are both called \"pp\""));
}

namespace {

// Sum and sum of squares of the global ranks in `over`: which ranks a group holds, as numbers.
std::pair<int64_t, int64_t> rank_sums(const cpprun::ProcessGroup& over) {
  const int64_t rank = group().rank();
  at::Tensor sums = at::tensor({rank, rank * rank}, at::kLong);
  cpprun::all_reduce(over, sums);
  return {sums[0].item<int64_t>(), sums[1].item<int64_t>()};
}

// The same sums over the ranks whose coordinates equal `coordinates` except in the dimensions `free`.
std::pair<int64_t, int64_t> expected_sums(const std::vector<int>& shape, const std::vector<int>& coordinates,
                                          const std::vector<int>& free) {
  const int world = std::accumulate(shape.begin(), shape.end(), 1, std::multiplies<int>());
  int64_t sum = 0, squares = 0;
  for (int r = 0; r < world; ++r) {
    bool member = true;
    for (int d = static_cast<int>(shape.size()) - 1, rest = r; d >= 0; --d) {
      const bool is_free = std::find(free.begin(), free.end(), d) != free.end();
      if (!is_free && rest % shape[d] != coordinates[d]) member = false;
      rest /= shape[d];
    }
    if (member) sum += r, squares += int64_t{r} * r;
  }
  return {sum, squares};
}

// Every 3-d shape of the world with its extents in {pp, dp, tp} order.
std::vector<std::vector<int>> shapes_of(int world) {
  std::vector<std::vector<int>> shapes;
  for (int pp = 1; pp <= world; ++pp) {
    for (int dp = 1; pp * dp <= world; ++dp) {
      if (world % (pp * dp) == 0) shapes.push_back({pp, dp, world / (pp * dp)});
    }
  }
  return shapes;
}

}  // namespace

TEST_CASE("device mesh: a 3-d {pp, dp, tp} mesh's groups and submeshes hold the right ranks", "[mesh]") {
  const int rank = group().rank();
  for (const auto& shape : shapes_of(group().size())) {
    INFO("shape {" << shape[0] << ", " << shape[1] << ", " << shape[2] << "}");
    cpprun::DeviceMesh mesh(group(), shape, {"pp", "dp", "tp"});
    CHECK(mesh.ndim() == 3);
    // Row-major: rank = (pp * D + dp) * T + tp.
    const std::vector<int> coordinates{rank / (shape[1] * shape[2]), (rank / shape[2]) % shape[1], rank % shape[2]};
    for (int d = 0; d < 3; ++d) {
      CHECK(mesh.coordinate(d) == coordinates[d]);
      CHECK(mesh.group(d).size() == shape[d]);
      CHECK(mesh.group(d).rank() == coordinates[d]);
      CHECK(rank_sums(mesh.group(d)) == expected_sums(shape, coordinates, {d}));
    }
    // PyTorch's mesh["dp", "tp"]: the ranks of this rank's pipeline stage, row-major over dp, tp.
    cpprun::DeviceMesh dp_tp = mesh.submesh({"dp", "tp"});
    CHECK(dp_tp.ndim() == 2);
    CHECK(dp_tp.names() == std::vector<std::string>{"dp", "tp"});
    CHECK(dp_tp.shape() == std::vector<int>{shape[1], shape[2]});
    CHECK(dp_tp.whole().size() == shape[1] * shape[2]);
    CHECK(dp_tp.whole().rank() == coordinates[1] * shape[2] + coordinates[2]);
    CHECK(rank_sums(dp_tp.whole()) == expected_sums(shape, coordinates, {1, 2}));
    CHECK(dp_tp.coordinate("tp") == coordinates[2]);
    CHECK(dp_tp.get_rank() == group().rank());  // the job's rank, as PyTorch's, not the submesh's
    CHECK(rank_sums(dp_tp.group("dp")) == expected_sums(shape, coordinates, {1}));
    // The order asked for is the submesh's: {tp, pp} ranks tp-major.
    cpprun::DeviceMesh tp_pp = mesh.submesh({"tp", "pp"});
    CHECK(tp_pp.whole().rank() == coordinates[2] * shape[0] + coordinates[0]);
    CHECK(rank_sums(tp_pp.whole()) == expected_sums(shape, coordinates, {0, 2}));
    // One dimension: its own group.
    CHECK(mesh.submesh({"pp"}).whole().rank() == coordinates[0]);
    CHECK(rank_sums(mesh.submesh({"pp"}).whole()) == expected_sums(shape, coordinates, {0}));
  }
  cpprun::DeviceMesh mesh(group(), {1, group().size(), 1}, {"pp", "dp", "tp"});
  CHECK_THROWS_WITH(mesh.submesh({"dp", "dp"}), Catch::Contains("\"dp\" is named twice"));
  CHECK_THROWS_WITH(mesh.submesh({"cp"}), Catch::Contains("\"pp\", \"dp\", \"tp\""));
  CHECK_THROWS_WITH(mesh.submesh({}), Catch::Contains("no dimension named"));
}

TEST_CASE("device mesh: node_local_mesh is nodes x local processes from the launcher", "[mesh]") {
  const int world = group().size(), rank = group().rank();
  auto mesh = cpprun::node_local_mesh(group());
  CHECK(mesh.names() == std::vector<std::string>{"node", "local"});
  CHECK(mesh.shape() == std::vector<int>{1, world});  // cpprun --standalone: one node
  CHECK(mesh.coordinate("local") == rank);
  CHECK(mesh.group("local").size() == world);
  CHECK(mesh.group("node").size() == 1);
  auto one_d = cpprun::DeviceMesh(group(), {world});
  CHECK(one_d.group(0).size() == world);
  CHECK(one_d.names() == std::vector<std::string>{"dim0"});
}

TEST_CASE("device mesh: node_local_mesh() with no group lays out the default group", "[mesh]") {
  const int world = group().size(), rank = group().rank();  // group() is the default group
  auto mesh = cpprun::node_local_mesh();
  CHECK(mesh.shape() == std::vector<int>{1, world});
  std::vector<int> everyone(world);
  std::iota(everyone.begin(), everyone.end(), 0);
  CHECK(cpprun::get_process_group_ranks(mesh.whole()) == everyone);
  CHECK(cpprun::get_process_group_ranks(mesh.group("local")) == everyone);
  CHECK(cpprun::get_process_group_ranks(mesh.group("node")) == std::vector<int>{rank});
  // Each dimension's group reduces over its own ranks only: all of them along "local", this one
  // along "node".
  at::Tensor local_sum = at::full({1}, rank + 1, at::kLong), node_sum = at::full({1}, rank + 1, at::kLong);
  cpprun::all_reduce(mesh.group("local"), local_sum);
  cpprun::all_reduce(mesh.group("node"), node_sum);
  CHECK(local_sum.item<int64_t>() == world * (world + 1) / 2);
  CHECK(node_sum.item<int64_t>() == rank + 1);
}

// A mesh laid out differently on different ranks gave each rank groups of other ranks than its
// peers believed (rank 0 {1, 2} beside rank 1 {2, 1}: exit 0, the collectives pairing the wrong
// ranks, or hanging). Every rank now refuses it, naming both layouts.
TEST_CASE("device mesh: ranks that build different meshes are refused, on every rank", "[mesh]") {
  const int world = group().size(), rank = group().rank();
  if (world < 2) return;
  const std::vector<int> mine = rank == 0 ? std::vector<int>{1, world} : std::vector<int>{world, 1};
  CHECK_THROWS_WITH(cpprun::DeviceMesh(group(), mine, {"dp", "tp"}),
                    Catch::Matchers::Contains("Every rank must build the same mesh") &&
                        Catch::Matchers::Contains("shape {1, " + std::to_string(world) + "}") &&
                        Catch::Matchers::Contains("shape {" + std::to_string(world) + ", 1}"));
  const std::vector<std::string> names = rank == 0 ? std::vector<std::string>{"dp", "tp"}
                                                   : std::vector<std::string>{"tp", "dp"};
  CHECK_THROWS_WITH(cpprun::DeviceMesh(group(), {1, world}, names),
                    Catch::Matchers::Contains("names \"dp\", \"tp\"") && Catch::Matchers::Contains("names \"tp\", \"dp\""));
  // The same layout everywhere still builds.
  cpprun::DeviceMesh same(group(), {1, world}, {"dp", "tp"});
  CHECK(same.size("tp") == world);
}

// The ranks of each dimension's group in PyTorch 2.15's init_device_mesh("cpu", (2, 2),
// mesh_dim_names=("dp", "tp")) at 4 ranks (torch/distributed/device_mesh.py: the identity rank map
// over the row-major layout _MeshLayout.from_sizes_strides(mesh_shape)), as its
// get_process_group_ranks(mesh["dp"].get_group()) printed them; dist.device_mesh_pytorch_parity
// compares with PyTorch itself.
TEST_CASE("device mesh: init_device_mesh lays the world out row-major, as PyTorch's", "[mesh]") {
  const int world = group().size(), rank = group().rank();
  if (world == 4) {
    auto mesh = cpprun::init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
    const std::vector<std::vector<int>> dp_of_rank{{0, 2}, {1, 3}, {0, 2}, {1, 3}};
    const std::vector<std::vector<int>> tp_of_rank{{0, 1}, {0, 1}, {2, 3}, {2, 3}};
    CHECK(mesh.names() == std::vector<std::string>{"dp", "tp"});
    CHECK(cpprun::get_process_group_ranks(mesh.group("dp")) == dp_of_rank[rank]);
    CHECK(cpprun::get_process_group_ranks(mesh.group("tp")) == tp_of_rank[rank]);
    CHECK(cpprun::get_process_group_ranks(mesh.whole()) == std::vector<int>{0, 1, 2, 3});
    CHECK(mesh.coordinate("dp") == rank / 2);
    CHECK(mesh.coordinate("tp") == rank % 2);
  }
  // Any world: 1-d over every rank with PyTorch's unnamed dimension, and {world, 1} by DeviceType.
  auto one_d = cpprun::init_device_mesh("cpu", {world});
  CHECK(one_d.names() == std::vector<std::string>{"dim0"});
  CHECK(one_d.group(0).size() == world);
  CHECK(one_d.coordinate(0) == rank);
  auto by_type = cpprun::init_device_mesh(c10::kCPU, {world, 1}, {"dp", "tp"});
  CHECK(by_type.coordinate("dp") == rank);
  CHECK(by_type.group("dp").size() == world);
  CHECK(cpprun::get_process_group_ranks(by_type.group("tp")) == std::vector<int>{rank});
}

// Every refusal depends only on the arguments and the world (Note [init_device_mesh's
// refusals]): each rank throws, none is left in a collective, and the mesh after them builds.
TEST_CASE("device mesh: init_device_mesh refuses what PyTorch refuses, and a mesh not of the world", "[mesh]") {
  const int world = group().size();
  const std::string w = std::to_string(world);
  using Shape = std::vector<int64_t>;
  using Names = std::vector<std::string>;
  CHECK_THROWS_WITH(cpprun::init_device_mesh("cpu", Shape{world, 1}, Names{"dp", "dp"}),
                    Catch::Contains("name dimensions 0 and 1 both \"dp\"; each mesh_dim_name must be unique"));
  CHECK_THROWS_WITH(cpprun::init_device_mesh("cpu", Shape{world, 1}, Names{"dp"}),
                    Catch::Contains("1 mesh_dim_names (\"dp\") for the 2 dimensions of mesh_shape {" + w + ", 1}"));
  CHECK_THROWS_WITH(cpprun::init_device_mesh("cpu", Shape{world}, Names{"dp", "tp"}),
                    Catch::Contains("2 mesh_dim_names"));
  CHECK_THROWS_WITH(cpprun::init_device_mesh("cpu", Shape{2, world}),
                    Catch::Contains("mesh_shape {2, " + w + "} needs more ranks than the world's " + w) &&
                        Catch::Contains("Mesh should not be bigger than default world size"));
  // A product that overflows int64 is still "more than the world", not a wrapped small number.
  CHECK_THROWS_WITH(cpprun::init_device_mesh("cpu", Shape{int64_t{1} << 40, int64_t{1} << 40}),
                    Catch::Contains("needs more ranks than the world's"));
  CHECK_THROWS_WITH(cpprun::init_device_mesh("cuda:0", Shape{world}),
                    Catch::Contains("device_type \"cuda:0\" is not a device type alone (it has an index)"));
  CHECK_THROWS_WITH(cpprun::init_device_mesh("xpu", Shape{world}), Catch::Contains("\"xpu\" is not one"));
  CHECK_THROWS_WITH(cpprun::init_device_mesh("cpu", Shape{}), Catch::Contains("mesh_shape is empty"));
  CHECK_THROWS_WITH(cpprun::init_device_mesh("cpu", Shape{0, world}),
                    Catch::Contains("mesh_shape {0, " + w + "} has size 0 at dimension 0"));
  CHECK_THROWS_WITH(cpprun::init_device_mesh("cpu", Shape{world, -1}), Catch::Contains("has size -1 at dimension 1"));
  if (world > 1) {
    // PyTorch accepts it, leaving the other ranks outside the mesh; ours hold every rank.
    CHECK_THROWS_WITH(cpprun::init_device_mesh("cpu", Shape{1}),
                      Catch::Contains("mesh_shape {1} holds 1 of the world's " + w + " ranks") &&
                          Catch::Contains("cpprun::new_group(ranks)"));
  }
  if (!cpprun::local_device().is_cuda()) {
    CHECK_THROWS_WITH(cpprun::init_device_mesh("cuda", Shape{world}),
                      Catch::Contains("not every rank of the job has a GPU of its own"));
  }
  CHECK(cpprun::init_device_mesh("cpu", Shape{world}).size(0) == world);
  // The DeviceMesh constructor's shape (ints): a product past int's range is counted, not wrapped
  // (3 x 1431655766 wrapped to 2 and was accepted on 2 ranks).
  CHECK_THROWS_WITH(cpprun::DeviceMesh(group(), {3, 1431655766}, {"a", "b"}),
                    Catch::Contains("holds 4294967298 ranks but the group has " + w));
}

// The old name of node_local_mesh keeps working until it goes.
TEST_CASE("device mesh: the deprecated init_device_mesh() is node_local_mesh()", "[mesh]") {
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  auto old_default = cpprun::init_device_mesh();
  auto old_given = cpprun::init_device_mesh(group());
#pragma GCC diagnostic pop
  CHECK(old_default.names() == std::vector<std::string>{"node", "local"});
  CHECK(old_default.shape() == cpprun::node_local_mesh().shape());
  CHECK(old_given.shape() == std::vector<int>{1, group().size()});
}
