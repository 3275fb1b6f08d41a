// all_to_all, gather, scatter, reduce, and all_gather into tensors of different sizes. Gloo and
// NCCL have the first four natively; sizes that must pair up across ranks are exchanged (or
// fingerprinted) first, because neither backend reports a mismatch cleanly.
#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <numeric>
#include <sstream>

#include "comm/public_call.h"
#include "comm/collective_support.h"
#include "comm/work_state.h"
#include "cpprun/collectives.h"

namespace cpprun {
namespace {

using detail::alone;
using detail::as_movable_bits;
using detail::check_member;
using detail::check_rank;
using detail::check_same_kind;
using detail::check_tensor;
using detail::CollectiveCall;
using detail::CollectiveKind;
using detail::issue_collective;

// Every rank's `mine` (same length on every rank), as rows of a [world, mine.numel()] tensor.
// An all_gather_into, so a rank whose row has another length fails at the ring's neighbour check.
at::Tensor exchange_rows(const ProcessGroup& group, const std::vector<int64_t>& mine) {
  at::Tensor row = at::tensor(mine, at::kLong);
  at::Tensor rows = at::empty({group.size(), row.numel()}, at::kLong);
  all_gather_into(group, rows, row);
  return rows;
}

// The backend's tensors for an op that only moves bits: NCCL takes any dtype, Gloo its own.
at::Tensor wire(const detail::GroupImpl& impl, const at::Tensor& t) {
  return impl.is_nccl(t) ? t : as_movable_bits(t);
}

void check_list(const char* op, const char* name, const std::vector<at::Tensor>& list,
                const at::Tensor& like, int world) {
  TORCH_CHECK(static_cast<int>(list.size()) == world, "cpprun::", op, ": ", name, " holds ",
              list.size(), " tensors on the root; it needs one per rank (", world, ").");
  for (std::size_t r = 0; r < list.size(); ++r) {
    const std::string which = std::string(name) + "[" + std::to_string(r) + "]";
    check_tensor(op, which.c_str(), list[r]);
    check_same_kind(op, list[r], like);
    TORCH_CHECK(list[r].sizes() == like.sizes(), "cpprun::", op, ": ", which, " has shape ",
                list[r].sizes(), " but every rank's tensor has shape ", like.sizes(), ".");
  }
}

// gather's outputs / scatter's inputs: one per rank on the root, none elsewhere. `verb` says
// what the root does ("receives", "sends").
void check_root_list(const char* op, const char* name, const std::vector<at::Tensor>& list, const char* like_name,
                     const at::Tensor& like, const ProcessGroup& group, int root, const char* verb) {
  check_tensor(op, like_name, like);
  check_member(op, group);
  check_rank(op, "root", root, group);
  if (group.rank() == root) {
    check_list(op, name, list, like, group.size());
  } else {
    TORCH_CHECK(list.empty(), "cpprun::", op, ": rank ", group.rank(), " is not the root (", root,
                ") but passed ", list.size(), " ", name, "; only the root ", verb, ".");
  }
}

// The root's list as c10d takes it: a list of one list, or none on the other ranks.
std::vector<std::vector<at::Tensor>> root_lists(const detail::GroupImpl& impl, const std::vector<at::Tensor>& list) {
  std::vector<std::vector<at::Tensor>> lists;
  if (list.empty()) return lists;
  lists.emplace_back();
  for (const auto& t : list) lists[0].push_back(wire(impl, t));
  return lists;
}

// Rows of dim 0 per peer: the given splits, or equal ones.
std::vector<int64_t> splits_or_equal(const char* name, std::vector<int64_t> splits, const at::Tensor& t,
                                     int world) {
  TORCH_CHECK(t.dim() >= 1, "cpprun::all_to_all: ", name, " is a scalar; it needs a dim 0 to split.");
  const int64_t rows = t.size(0);
  if (splits.empty()) {
    TORCH_CHECK(rows % world == 0, "cpprun::all_to_all: ", name, " has ", rows, " rows (dim 0), "
                "which do not divide into world_size (", world, ") equal pieces. Pad it, or pass "
                "split sizes.");
    return std::vector<int64_t>(world, rows / world);
  }
  TORCH_CHECK(static_cast<int>(splits.size()) == world, "cpprun::all_to_all: ", name, " splits has ",
              splits.size(), " entries; it needs one per rank (", world, ").");
  for (int64_t s : splits) {
    TORCH_CHECK(s >= 0, "cpprun::all_to_all: ", name, " split sizes must not be negative, got ", s, ".");
  }
  const int64_t total = std::accumulate(splits.begin(), splits.end(), int64_t{0});
  TORCH_CHECK(total == rows, "cpprun::all_to_all: ", name, " split sizes add up to ", total,
              " rows, but ", name, " has ", rows, " (dim 0).");
  return splits;
}

int64_t row_elements(const at::Tensor& t) { return t.size(0) == 0 ? -1 : t.numel() / t.size(0); }

}  // namespace

// ---- all_to_all ----------------------------------------------------------------------------

Work all_to_all_async(const ProcessGroup& group, at::Tensor output, at::Tensor input,
                      std::vector<int64_t> output_splits, std::vector<int64_t> input_splits) {
  detail::PublicCallScope public_call("cpprun::all_to_all");  // its split check's all-gather is its own
  output = detail::written_in_place(output);
  check_tensor("all_to_all", "input", input);
  check_tensor("all_to_all", "output", output);
  check_same_kind("all_to_all", output, input);
  check_member("all_to_all", group);
  // Rows arrive while others are still to be sent: in place, a row could be overwritten before it
  // left (PyTorch's Gloo races the same way, wrong in 1 run of 5).
  TORCH_CHECK(output.numel() == 0 || input.numel() == 0 ||
                  at::get_overlap_status(output, input) == at::MemOverlapStatus::No,
              "cpprun::all_to_all: output and input share memory; it cannot run in place. Pass a separate "
              "output (e.g. at::empty_like(input)).");
  const int n = group.size();
  const auto out_splits = splits_or_equal("output", std::move(output_splits), output, n);
  const auto in_splits = splits_or_equal("input", std::move(input_splits), input, n);
  TORCH_CHECK(output.numel() == 0 || input.numel() == 0 || row_elements(output) == row_elements(input),
              "cpprun::all_to_all: a row (dim 0 slice) of output has ", row_elements(output),
              " elements but one of input has ", row_elements(input), ".");
  if (n == 1) {
    // Alone, the one pair the exchange below checks is this rank's with itself.
    TORCH_CHECK(in_splits[0] == out_splits[0], "cpprun::all_to_all: rank 0 sends ", in_splits[0],
                " rows to rank 0, but rank 0 expects ", out_splits[0], " rows from rank 0 (found on rank 0). Rank "
                "r's input_splits[s] must equal rank s's output_splits[r].");
    output.copy_(input.view_as(output));
    return Work();
  }
  // Note [All-to-all split exchange]
  // Rank r's input_splits[s] must equal rank s's output_splits[r]; otherwise Gloo writes past
  // or short of a buffer, or aborts in its I/O thread. Every rank's splits (and dtype) travel
  // to every rank first, so every rank finds the same first bad pair and throws one message.
  std::vector<int64_t> mine{static_cast<int64_t>(input.scalar_type()),
                            std::max(row_elements(input), row_elements(output))};
  mine.insert(mine.end(), in_splits.begin(), in_splits.end());
  mine.insert(mine.end(), out_splits.begin(), out_splits.end());
  at::Tensor all = exchange_rows(group, mine);
  const auto rows = all.accessor<int64_t, 2>();
  auto at_ = [&](int r, int64_t slot) { return rows[r][slot]; };
  for (int r = 0; r < n; ++r) {
    TORCH_CHECK(at_(r, 0) == mine[0], "cpprun::all_to_all: rank ", r, " sends ",
                c10::toString(static_cast<at::ScalarType>(at_(r, 0))), " but rank ", group.rank(),
                " sends ", input.scalar_type(), ". Every rank must pass one dtype.");
    TORCH_CHECK(at_(r, 1) < 0 || mine[1] < 0 || at_(r, 1) == mine[1], "cpprun::all_to_all: rank ", r,
                "'s rows hold ", at_(r, 1), " elements but rank ", group.rank(), "'s hold ", mine[1],
                ". Every rank's tensors must agree on all dims after the first.");
    for (int s = 0; s < n; ++s) {
      const int64_t sends = at_(r, 2 + s), expects = at_(s, 2 + n + r);
      TORCH_CHECK(sends == expects, "cpprun::all_to_all: rank ", r, " sends ", sends,
                  " rows to rank ", s, ", but rank ", s, " expects ", expects, " rows from rank ", r,
                  " (found on rank ", group.rank(), "). Rank r's input_splits[s] must equal rank s's "
                  "output_splits[r].");
    }
  }
  auto& impl = detail::impl_of(group);
  CollectiveCall call{CollectiveKind::kAllToAll, {output, input}, std::nullopt, std::nullopt, true};
  return issue_collective(group, call, [&](uint64_t) {
    at::Tensor out = wire(impl, output), in = wire(impl, input);
    std::vector<int64_t> out_s = out_splits, in_s = in_splits;
    return make_work(impl.group_for(input).alltoall_base(out, in, out_s, in_s));
  });
}

void all_to_all(const ProcessGroup& group, at::Tensor output, at::Tensor input,
                std::vector<int64_t> output_splits, std::vector<int64_t> input_splits) {
  all_to_all_async(group, std::move(output), std::move(input), std::move(output_splits),
                   std::move(input_splits)).wait();
}

// ---- gather / scatter ----------------------------------------------------------------------

Work gather_async(const ProcessGroup& group, at::Tensor input, std::vector<at::Tensor> outputs, int root) {
  for (at::Tensor& output : outputs) output = detail::written_in_place(output);
  check_root_list("gather", "outputs", outputs, "input", input, group, root, "receives");
  if (alone("gather", group)) {
    outputs[0].copy_(input);
    return Work();
  }
  auto& impl = detail::impl_of(group);
  CollectiveCall call{CollectiveKind::kGather, {input}, root, std::nullopt};
  return issue_collective(group, call, [&](uint64_t) {
    std::vector<at::Tensor> inputs{wire(impl, input)};
    auto out_lists = root_lists(impl, outputs);
    c10d::GatherOptions opts;
    opts.rootRank = root;
    return make_work(impl.group_for(input).gather(out_lists, inputs, opts));
  });
}

void gather(const ProcessGroup& group, at::Tensor input, std::vector<at::Tensor> outputs, int root) {
  gather_async(group, std::move(input), std::move(outputs), root).wait();
}

Work scatter_async(const ProcessGroup& group, at::Tensor output, std::vector<at::Tensor> inputs, int root) {
  output = detail::written_in_place(output);
  check_root_list("scatter", "inputs", inputs, "output", output, group, root, "sends");
  if (alone("scatter", group)) {
    output.copy_(inputs[0]);
    return Work();
  }
  auto& impl = detail::impl_of(group);
  CollectiveCall call{CollectiveKind::kScatter, {output}, root, std::nullopt};
  return issue_collective(group, call, [&](uint64_t) {
    std::vector<at::Tensor> outputs{wire(impl, output)};
    auto in_lists = root_lists(impl, inputs);
    c10d::ScatterOptions opts;
    opts.rootRank = root;
    return make_work(impl.group_for(output).scatter(outputs, in_lists, opts));
  });
}

void scatter(const ProcessGroup& group, at::Tensor output, std::vector<at::Tensor> inputs, int root) {
  scatter_async(group, std::move(output), std::move(inputs), root).wait();
}

// ---- reduce --------------------------------------------------------------------------------

Work reduce_async(const ProcessGroup& group, at::Tensor tensor, int root, ReduceOp op) {
  tensor = detail::written_in_place(tensor);
  check_tensor("reduce", "tensor", tensor);
  detail::check_reduction("reduce", tensor, op);
  check_member("reduce", group);
  check_rank("reduce", "root", root, group);
  if (alone("reduce", group)) return Work();
  auto& impl = detail::impl_of(group);
  // As all_reduce: a type Gloo refuses travels as one it reduces (Note [Reductions Gloo cannot
  // do]). Gloo also reduces into the other ranks' buffers: they send a copy, so that only the
  // root's tensor changes.
  const bool gloo = !impl.is_nccl(tensor);
  detail::ReductionWire wire = gloo ? detail::gloo_reduction_wire(tensor, op) : detail::ReductionWire{tensor, true, false};
  if (gloo && group.rank() != root && wire.aliases) wire = {wire.wire.clone(), false, wire.top_bit_flipped};
  CollectiveCall call{CollectiveKind::kReduce, {tensor}, root, op};
  return issue_collective(group, call, [&](uint64_t) {
    std::vector<at::Tensor> tensors{wire.wire};
    c10d::ReduceOptions opts;
    opts.reduceOp = detail::to_c10d(op);
    opts.rootRank = root;
    auto work = impl.group_for(tensor).reduce(tensors, opts);
    const bool is_root = group.rank() == root;
    const int size = group.size();
    return make_work(std::move(work), [tensor, wire, op, size, is_root]() mutable {
      if (!is_root) return;
      if (op == ReduceOp::kAvg) wire.wire.div_(size);
      detail::write_back(tensor, wire);
    });
  });
}

void reduce(const ProcessGroup& group, at::Tensor tensor, int root, ReduceOp op) {
  reduce_async(group, std::move(tensor), root, op).wait();
}

// ---- all_gather of uneven sizes ------------------------------------------------------------

// Note [All-gather of uneven sizes]
// Gloo gathers equal sizes only. Each rank first sends its dtype, its input's element count and
// the element counts of its outputs; every rank checks every rank's outputs against the others'
// inputs (so all throw the same error), then the inputs travel padded to the largest and land in
// the outputs sliced back. The padding costs (max - mean) elements per rank.
Work all_gather_async(const ProcessGroup& group, std::vector<at::Tensor> outputs, const at::Tensor& input) {
  for (at::Tensor& output : outputs) output = detail::written_in_place(output);
  check_tensor("all_gather", "input", input);
  check_member("all_gather", group);
  const int n = group.size();
  TORCH_CHECK(static_cast<int>(outputs.size()) == n, "cpprun::all_gather: outputs holds ",
              outputs.size(), " tensors; it needs one per rank (", n, ").");
  for (int r = 0; r < n; ++r) {
    const std::string which = "outputs[" + std::to_string(r) + "]";
    check_tensor("all_gather", which.c_str(), outputs[r]);
    check_same_kind("all_gather", outputs[r], input);
  }
  if (n == 1) {
    TORCH_CHECK(outputs[0].numel() == input.numel(), "cpprun::all_gather: outputs[0] has ",
                outputs[0].numel(), " elements but the input has ", input.numel(), ".");
    outputs[0].view({-1}).copy_(input.reshape({-1}));
    return Work();
  }
  std::vector<int64_t> mine{static_cast<int64_t>(input.scalar_type()), input.numel()};
  for (const auto& out : outputs) mine.push_back(out.numel());
  at::Tensor all = exchange_rows(group, mine);
  const auto rows = all.accessor<int64_t, 2>();
  auto at_ = [&](int r, int64_t slot) { return rows[r][slot]; };
  int64_t largest = 0;
  for (int r = 0; r < n; ++r) {
    TORCH_CHECK(at_(r, 0) == mine[0], "cpprun::all_gather: rank ", r, " sends ",
                c10::toString(static_cast<at::ScalarType>(at_(r, 0))), " but rank ", group.rank(),
                " sends ", input.scalar_type(), ". Every rank must pass one dtype.");
    largest = std::max(largest, at_(r, 1));
    for (int s = 0; s < n; ++s) {
      TORCH_CHECK(at_(r, 2 + s) == at_(s, 1), "cpprun::all_gather: rank ", r, "'s outputs[", s,
                  "] has ", at_(r, 2 + s), " elements, but rank ", s, "'s input has ", at_(s, 1),
                  " (found on rank ", group.rank(), "). outputs[s] must hold rank s's input.");
    }
  }
  if (largest == 0) return Work();  // nothing to move
  at::Tensor padded = at::zeros({largest}, input.options());
  padded.narrow(0, 0, input.numel()).copy_(input.reshape({-1}));
  at::Tensor gathered = at::empty({n * largest}, input.options());
  Work work = all_gather_into_async(group, gathered, padded);
  return work.then([outputs, gathered, largest, n]() {
    for (int r = 0; r < n; ++r) {
      outputs[r].view({-1}).copy_(gathered.narrow(0, r * largest, outputs[r].numel()));
    }
  });
}

void all_gather(const ProcessGroup& group, std::vector<at::Tensor> outputs, const at::Tensor& input) {
  all_gather_async(group, std::move(outputs), input).wait();
}

}  // namespace cpprun
