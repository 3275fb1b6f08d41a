// Byte strings over the tensor collectives: the transport under cpprun/object_collectives.h.
#include "cpprun/object_collectives.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/serialize/archive.h>

#include <sstream>

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

at::Tensor as_tensor(const std::string& bytes) {
  at::Tensor t = at::empty({static_cast<int64_t>(bytes.size())}, at::kByte);
  if (!bytes.empty()) std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
  return t;
}

// A size another rank sent. Negative or beyond what this process can hold, it was not an object's
// size: that rank called another collective (a tensor broadcast) where this one called `op`.
at::Tensor bytes_to_receive(int64_t n, int from, const char* op) {
  TORCH_CHECK(n >= 0, "cpprun::", op, ": rank ", from, " of the group announced ", n, " bytes; did it call ", op,
              " with this rank, or another collective (a tensor broadcast / all_gather)?");
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
