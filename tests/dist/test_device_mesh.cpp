// DeviceMesh under `cpprun --nproc_per_node=K`, K = 1..4: each dimension's group holds the
// ranks that differ only along it, names and shapes are checked, and the default mesh follows
// the launcher's WORLD_SIZE / LOCAL_WORLD_SIZE, with or without a group given.
#include "catch.h"
#include <ATen/ATen.h>

#include <numeric>
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
  CHECK_THROWS_WITH(cpprun::DeviceMesh(group(), {1, 1, world}), Catch::Contains("1 or 2 are supported"));
}

TEST_CASE("device mesh: the default mesh is nodes x local processes from the launcher", "[mesh]") {
  const int world = group().size(), rank = group().rank();
  auto mesh = cpprun::init_device_mesh(group());
  CHECK(mesh.names() == std::vector<std::string>{"node", "local"});
  CHECK(mesh.shape() == std::vector<int>{1, world});  // cpprun --standalone: one node
  CHECK(mesh.coordinate("local") == rank);
  CHECK(mesh.group("local").size() == world);
  CHECK(mesh.group("node").size() == 1);
  auto one_d = cpprun::DeviceMesh(group(), {world});
  CHECK(one_d.group(0).size() == world);
  CHECK(one_d.names() == std::vector<std::string>{"dim0"});
}

TEST_CASE("device mesh: init_device_mesh() with no group lays out the default group", "[mesh]") {
  const int world = group().size(), rank = group().rank();  // group() is the default group
  auto mesh = cpprun::init_device_mesh();
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
