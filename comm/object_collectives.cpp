// Byte strings over the tensor collectives: the transport under cpprun/object_collectives.h.
#include "cpprun/object_collectives.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <c10/util/Type.h>
#include <torch/serialize/archive.h>

#include <algorithm>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "comm/group_membership.h"
#include "comm/public_call.h"
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

// Note [An object's type on the wire]
// A value travels as its codec's bytes, and a rank that passed another type decoded them as its
// own: rank 0's std::string "12345678" became rank 1's int64_t 4050765991979987505, without a
// word (an audit, 2026-12-07; only a size that no element divides was caught). PyTorch pickles the
// type with the value. Here each rank's sizes go with its type's mangled name, hashed (one more
// int64 in the size exchange every call makes anyway), and a rank that finds another type than its
// own refuses, naming its own. The check comes after the data has moved, so that every rank has
// made the same collectives whichever refuses. The byte-level calls send no type (0) and check
// none, so bytes and a std::string still meet.
uint64_t detail::object_type_tag(const char* mangled_name) {
  uint64_t hash = 1469598103934665603ull;  // FNV-1a
  for (const char* c = mangled_name; *c; ++c) hash = (hash ^ static_cast<unsigned char>(*c)) * 1099511628211ull;
  return hash == 0 ? 1 : hash;
}

namespace {

int64_t as_wire(uint64_t tag) {
  int64_t out;
  std::memcpy(&out, &tag, sizeof out);
  return out;
}

void check_same_type(int64_t sent, int from, const detail::ObjectType& mine, const char* op) {
  uint64_t theirs;
  std::memcpy(&theirs, &sent, sizeof theirs);
  if (theirs == 0 || mine.tag == 0 || theirs == mine.tag) return;
  TORCH_CHECK(false, "cpprun::", op, ": rank ", from, " of the group passed a value of another C++ type than this ",
              "rank's ", c10::demangle(mine.name), ". Every rank must pass the same type: the value travels as its "
              "bytes, and this rank would have read the other type's bytes as its own.");
}

// Every rank's size and type tag, on every rank (one small all-gather), read once.
struct Announced {
  int64_t size = 0;
  int64_t type = 0;  // as_wire(tag)
};
std::vector<Announced> all_gather_announced(const ProcessGroup& group, const std::string& bytes,
                                            const detail::ObjectType& type) {
  const int n = group.size();
  at::Tensor headers = at::empty({n * 2}, at::kLong);
  all_gather_into(group, headers, at::tensor({static_cast<int64_t>(bytes.size()), as_wire(type.tag)}, at::kLong));
  const at::Tensor by_rank = headers.view({n, 2});  // named: the accessor points into its sizes
  const auto read = by_rank.accessor<int64_t, 2>();
  std::vector<Announced> out(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) out[static_cast<std::size_t>(r)] = {read[r][0], read[r][1]};
  return out;
}

// After the data moved: every rank has every rank's type, and all refuse alike.
void check_every_type(const std::vector<Announced>& announced, const detail::ObjectType& mine, const char* op) {
  for (std::size_t r = 0; r < announced.size(); ++r) {
    check_same_type(announced[r].type, static_cast<int>(r), mine, op);
  }
}

}  // namespace

void detail::broadcast_bytes(const ProcessGroup& group, std::string& bytes, int root, ObjectType type) {
  PublicCallScope call("cpprun::broadcast_object");  // its size exchange and data are its own
  detail::check_member("broadcast_object", group);
  at::Tensor header = at::tensor({static_cast<int64_t>(bytes.size()), as_wire(type.tag)}, at::kLong);
  broadcast(group, header, root);
  const int64_t n = header[0].item<int64_t>();
  if (n == 0) {
    if (group.rank() != root) bytes.clear();
  } else {
    at::Tensor data = group.rank() == root ? as_tensor(bytes) : bytes_to_receive(n, root, "broadcast_object");
    broadcast(group, data, root);
    if (group.rank() != root) bytes = as_bytes(data);
  }
  if (group.rank() != root) check_same_type(header[1].item<int64_t>(), root, type, "broadcast_object");
}

std::vector<std::string> detail::all_gather_bytes(const ProcessGroup& group, const std::string& bytes,
                                                  ObjectType type) {
  PublicCallScope call("cpprun::all_gather_object");  // its size exchange and data are its own
  detail::check_member("all_gather_object", group);
  const std::vector<Announced> announced = all_gather_announced(group, bytes, type);
  std::vector<at::Tensor> outputs;
  for (std::size_t r = 0; r < announced.size(); ++r) {
    outputs.push_back(bytes_to_receive(announced[r].size, static_cast<int>(r), "all_gather_object"));
  }
  all_gather(group, outputs, as_tensor(bytes));
  check_every_type(announced, type, "all_gather_object");
  std::vector<std::string> result;
  for (const auto& t : outputs) result.push_back(as_bytes(t));
  return result;
}

std::vector<std::string> detail::gather_bytes(const ProcessGroup& group, const std::string& bytes, int root,
                                              ObjectType type) {
  PublicCallScope call("cpprun::gather_object");  // its size exchange and data are its own
  detail::check_member("gather_object", group);
  // Every rank's size on every rank: each pads to the largest, as gather takes one shape from
  // every rank.
  const int n = group.size();
  const std::vector<Announced> announced = all_gather_announced(group, bytes, type);
  int64_t widest = 0;
  for (int r = 0; r < n; ++r) {
    check_announced(announced[static_cast<std::size_t>(r)].size, r, "gather_object");
    widest = std::max(widest, announced[static_cast<std::size_t>(r)].size);
  }
  std::vector<std::string> result;
  if (widest > 0) {
    std::vector<at::Tensor> outputs;
    if (group.rank() == root) {
      for (int r = 0; r < n; ++r) outputs.push_back(bytes_to_receive(widest, r, "gather_object"));
    }
    gather(group, as_tensor(bytes, widest), outputs, root);
    for (int r = 0; r < static_cast<int>(outputs.size()); ++r) {
      const auto i = static_cast<std::size_t>(r);
      result.push_back(as_bytes(outputs[i].narrow(0, 0, announced[i].size)));
    }
  } else if (group.rank() == root) {
    result.assign(static_cast<std::size_t>(n), std::string());
  }
  check_every_type(announced, type, "gather_object");
  return result;
}

std::string detail::scatter_bytes(const ProcessGroup& group, const std::vector<std::string>& pieces, int root,
                                  ObjectType type) {
  PublicCallScope call("cpprun::scatter_object");  // its size exchange and data are its own
  detail::check_member("scatter_object", group);
  const int n = group.size();
  TORCH_CHECK(root >= 0 && root < n, "cpprun::scatter_object: root ", root, " is not a rank of this group (0..",
              n - 1, ").");
  // The root's sizes for every rank and its type, broadcast: a root given another count than the
  // group's size says so in them (all -1), and every rank refuses alike rather than waiting.
  at::Tensor header = at::full({n + 1}, int64_t{-1}, at::kLong);
  const bool is_root = group.rank() == root;
  if (is_root && static_cast<int>(pieces.size()) == n) {
    for (int r = 0; r < n; ++r) header[r] = static_cast<int64_t>(pieces[static_cast<std::size_t>(r)].size());
  }
  header[n] = as_wire(type.tag);
  broadcast(group, header, root);
  at::Tensor sizes = header.narrow(0, 0, n);
  TORCH_CHECK(sizes[0].item<int64_t>() >= 0, "cpprun::scatter_object: rank ", root, " (the root) was given ",
              is_root ? std::to_string(pieces.size()) : std::string("another number of"), " values for the group's ",
              n, " ranks; give the root one value per rank.");
  const int64_t widest = sizes.max().item<int64_t>();
  std::string mine;
  if (widest > 0) {
    at::Tensor output = bytes_to_receive(widest, root, "scatter_object");
    std::vector<at::Tensor> inputs;
    if (is_root) {
      for (const std::string& piece : pieces) inputs.push_back(as_tensor(piece, widest));
    }
    scatter(group, output, inputs, root);
    mine = as_bytes(output.narrow(0, 0, sizes[group.rank()].item<int64_t>()));
  }
  if (!is_root) check_same_type(header[n].item<int64_t>(), root, type, "scatter_object");
  return mine;
}

void broadcast_bytes(const ProcessGroup& group, std::string& bytes, int root) {
  detail::broadcast_bytes(group, bytes, root, detail::ObjectType{});
}

std::vector<std::string> all_gather_bytes(const ProcessGroup& group, const std::string& bytes) {
  return detail::all_gather_bytes(group, bytes, detail::ObjectType{});
}

std::vector<std::string> gather_bytes(const ProcessGroup& group, const std::string& bytes, int root) {
  return detail::gather_bytes(group, bytes, root, detail::ObjectType{});
}

std::string scatter_bytes(const ProcessGroup& group, const std::vector<std::string>& pieces, int root) {
  return detail::scatter_bytes(group, pieces, root, detail::ObjectType{});
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
