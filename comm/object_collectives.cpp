// Byte strings over the tensor collectives: the transport under cpprun/object_collectives.h.
#include "cpprun/object_collectives.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/serialize/archive.h>

#include <algorithm>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "comm/group_membership.h"
#include "cpprun/collectives.h"

namespace cpprun {
namespace detail {

void throw_bad_object_size(const char* type, std::size_t bytes, std::size_t expected) {
  TORCH_CHECK(false, "cpprun: an object of ", bytes, " bytes arrived where a ", type, " of ", expected,
              " bytes (or a whole multiple) was expected. Do all ranks pass the same C++ type to "
              "broadcast_object / all_gather_object?");
}

}  // namespace detail

namespace {

// BYTES as a byte tensor, zero-padded to WIDTH (gather and scatter take one shape from every rank).
at::Tensor as_tensor(const std::string& bytes, int64_t width) {
  const bool exact = static_cast<int64_t>(bytes.size()) == width;
  at::Tensor t = exact ? at::empty({width}, at::kByte) : at::zeros({width}, at::kByte);
  if (!bytes.empty()) std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
  return t;
}
at::Tensor as_tensor(const std::string& bytes) { return as_tensor(bytes, static_cast<int64_t>(bytes.size())); }

// A size another rank sent. Negative or beyond what this process can hold, it was not an object's
// size: that rank called another collective (a tensor broadcast) where this one called `op`.
void check_announced(int64_t n, int from, const char* op) {
  TORCH_CHECK(n >= 0, "cpprun::", op, ": rank ", from, " of the group announced ", n, " bytes; did it call ", op,
              " with this rank, or another collective (a tensor broadcast / all_gather)?");
}

at::Tensor bytes_to_receive(int64_t n, int from, const char* op) {
  check_announced(n, from, op);
  try {
    return at::empty({n}, at::kByte);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "cpprun::", op, ": rank ", from, " of the group announced an object of ", n,
                " bytes, which this process cannot hold (", e.what(), "); did it call ", op,
                " with this rank, or another collective?");
  }
}

std::string as_bytes(const at::Tensor& t) {
  return std::string(static_cast<const char*>(t.const_data_ptr()), static_cast<std::size_t>(t.numel()));
}

}  // namespace

void broadcast_bytes(const ProcessGroup& group, std::string& bytes, int root) {
  detail::check_member("broadcast_object", group);
  at::Tensor size = at::tensor({static_cast<int64_t>(bytes.size())}, at::kLong);
  broadcast(group, size, root);
  const int64_t n = size.item<int64_t>();
  if (n == 0) {
    bytes.clear();
    return;
  }
  at::Tensor data = group.rank() == root ? as_tensor(bytes) : bytes_to_receive(n, root, "broadcast_object");
  broadcast(group, data, root);
  if (group.rank() != root) bytes = as_bytes(data);
}

std::vector<std::string> all_gather_bytes(const ProcessGroup& group, const std::string& bytes) {
  detail::check_member("all_gather_object", group);
  const int n = group.size();
  at::Tensor sizes = at::empty({n}, at::kLong);
  all_gather_into(group, sizes, at::tensor({static_cast<int64_t>(bytes.size())}, at::kLong));
  std::vector<at::Tensor> outputs;
  for (int r = 0; r < n; ++r) outputs.push_back(bytes_to_receive(sizes[r].item<int64_t>(), r, "all_gather_object"));
  all_gather(group, outputs, as_tensor(bytes));
  std::vector<std::string> result;
  for (const auto& t : outputs) result.push_back(as_bytes(t));
  return result;
}

std::vector<std::string> gather_bytes(const ProcessGroup& group, const std::string& bytes, int root) {
  detail::check_member("gather_object", group);
  // Every rank's size on every rank (one small all-gather): each pads to the largest, as gather
  // takes one shape from every rank.
  const int n = group.size();
  at::Tensor sizes = at::empty({n}, at::kLong);
  all_gather_into(group, sizes, at::tensor({static_cast<int64_t>(bytes.size())}, at::kLong));
  int64_t widest = 0;
  for (int r = 0; r < n; ++r) {
    const int64_t size = sizes[r].item<int64_t>();
    check_announced(size, r, "gather_object");
    widest = std::max(widest, size);
  }
  std::vector<std::string> result;
  if (widest == 0) {
    if (group.rank() == root) result.assign(static_cast<std::size_t>(n), std::string());
    return result;
  }
  std::vector<at::Tensor> outputs;
  if (group.rank() == root) {
    for (int r = 0; r < n; ++r) outputs.push_back(bytes_to_receive(widest, r, "gather_object"));
  }
  gather(group, as_tensor(bytes, widest), outputs, root);
  for (int r = 0; r < static_cast<int>(outputs.size()); ++r) {
    result.push_back(as_bytes(outputs[static_cast<std::size_t>(r)].narrow(0, 0, sizes[r].item<int64_t>())));
  }
  return result;
}

std::string scatter_bytes(const ProcessGroup& group, const std::vector<std::string>& pieces, int root) {
  detail::check_member("scatter_object", group);
  const int n = group.size();
  TORCH_CHECK(root >= 0 && root < n, "cpprun::scatter_object: root ", root, " is not a rank of this group (0..",
              n - 1, ").");
  // The root's sizes for every rank, broadcast: a root given another count than the group's
  // size says so in them (all -1), and every rank refuses alike rather than waiting.
  at::Tensor sizes = at::full({n}, int64_t{-1}, at::kLong);
  const bool is_root = group.rank() == root;
  if (is_root && static_cast<int>(pieces.size()) == n) {
    for (int r = 0; r < n; ++r) sizes[r] = static_cast<int64_t>(pieces[static_cast<std::size_t>(r)].size());
  }
  broadcast(group, sizes, root);
  TORCH_CHECK(sizes[0].item<int64_t>() >= 0, "cpprun::scatter_object: rank ", root, " (the root) was given ",
              is_root ? std::to_string(pieces.size()) : std::string("another number of"), " values for the group's ",
              n, " ranks; give the root one value per rank.");
  const int64_t widest = sizes.max().item<int64_t>();
  if (widest == 0) return std::string();
  at::Tensor output = bytes_to_receive(widest, root, "scatter_object");
  std::vector<at::Tensor> inputs;
  if (is_root) {
    for (const std::string& piece : pieces) inputs.push_back(as_tensor(piece, widest));
  }
  scatter(group, output, inputs, root);
  return as_bytes(output.narrow(0, 0, sizes[group.rank()].item<int64_t>()));
}

std::string archive_bytes(torch::serialize::OutputArchive& archive) {
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

void load_archive(torch::serialize::InputArchive& archive, const std::string& bytes) {
  std::istringstream in(bytes);
  archive.load_from(in);
}

}  // namespace cpprun
