// Collectives with one signature whatever the backend (point-to-point messages: point_to_point.h;
// objects: object_collectives.h). Each has a blocking form and an `_async`
// form that returns a Work to wait on. On Gloo, reduce-scatter and all-gather into one tensor are
// our own rings over send/recv (3-4x faster than Gloo's own in LibTorch 2.15; see docs/process_groups.md), and
// types Gloo cannot reduce travel exactly as ones it can (int16 and bool as int32, uint64 as its bits).
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "cpprun/process_group.h"

namespace cpprun {
namespace detail {
struct WorkAccess;  // comm/work_state.h: how the library makes a Work
}  // namespace detail

// torch.distributed.ReduceOp's SUM, AVG, MAX, MIN, PRODUCT, BAND, BOR and BXOR. kAvg needs a
// floating or complex tensor, kMax / kMin an ordered one, the bitwise three an integer or bool one;
// a complex tensor takes kSum and kAvg only. NCCL has no bitwise reductions (c10d refuses them).
// PyTorch's PREMUL_SUM is not offered: scale the tensor, then kSum.
enum class ReduceOp { kSum, kAvg, kMax, kMin, kProduct, kBAnd, kBOr, kBXor };
const char* to_string(ReduceOp op);

// Every `root` below is a rank of `group` (PyTorch's group_src / group_dst), not a rank of the
// world (PyTorch's src / dst): in a subgroup of world ranks {1, 2}, root 0 is world rank 1.

// Handle to a collective in flight. wait() blocks until it is done, rethrows its error, and
// finishes any step that follows it (e.g. converting a bf16 result back). Waiting twice is fine.
// is_completed() true means the result is in place (it finishes that step too). A Work let go
// unfinished runs on, as a PyTorch request let go does.
class Work {
 public:
  Work();  // an already-completed no-op
  void wait();
  bool is_completed() const;
  // Holds the group until this work is gone, for work that runs on the group's own thread.
  void keep_alive(const ProcessGroup& group);
  // A work that waits for this one, then runs `step` once (e.g. decompressing a result).
  Work then(std::function<void()> step) const;

 private:
  struct State;  // comm/work_state.h
  friend struct detail::WorkAccess;
  explicit Work(std::shared_ptr<State> state);

  std::shared_ptr<State> state_;
};

// In place: every rank ends with the reduction of all ranks' `tensor`.
Work all_reduce_async(const ProcessGroup& group, at::Tensor tensor, ReduceOp op = ReduceOp::kSum);
void all_reduce(const ProcessGroup& group, at::Tensor tensor, ReduceOp op = ReduceOp::kSum);

// In place: every rank ends with rank `root`'s `tensor`.
Work broadcast_async(const ProcessGroup& group, at::Tensor tensor, int root = 0);
void broadcast(const ProcessGroup& group, at::Tensor tensor, int root = 0);

// output (world_size * input.numel() elements) = the ranks' inputs concatenated in rank order.
Work all_gather_into_async(const ProcessGroup& group, at::Tensor output, at::Tensor input);
void all_gather_into(const ProcessGroup& group, at::Tensor output, at::Tensor input);

// input (world_size * output.numel() elements) is split into world_size equal chunks;
// rank r's output = the reduction over ranks of chunk r.
Work reduce_scatter_async(const ProcessGroup& group, at::Tensor output, at::Tensor input,
                          ReduceOp op = ReduceOp::kSum);
void reduce_scatter(const ProcessGroup& group, at::Tensor output, at::Tensor input,
                    ReduceOp op = ReduceOp::kSum);

// PyTorch's names for the two above: all_gather_into_tensor(output, input) and
// reduce_scatter_tensor(output, input, op) (PyTorch's all_gather and reduce_scatter take lists).
inline void all_gather_into_tensor(const ProcessGroup& group, at::Tensor output, at::Tensor input) {
  all_gather_into(group, std::move(output), std::move(input));
}
inline void reduce_scatter_tensor(const ProcessGroup& group, at::Tensor output, at::Tensor input,
                                  ReduceOp op = ReduceOp::kSum) {
  reduce_scatter(group, std::move(output), std::move(input), op);
}

// Every rank's `tensors` get rank `root`'s values, tensors of one dtype and device packed into
// one message (e.g. a model's parameters and buffers).
void broadcast_coalesced(const ProcessGroup& group, const std::vector<at::Tensor>& tensors, int root = 0);

Work barrier_async(const ProcessGroup& group);
void barrier(const ProcessGroup& group);

// ---- all-to-all, gather, scatter, reduce, all-gather of uneven sizes (comm/scatter_gather.cpp)

// Rank r's input is cut along dim 0 into world_size pieces, input_splits[s] rows for rank s;
// rank r's output receives rank s's piece for r in its output_splits[s] rows, in rank order.
// Empty splits: equal pieces (dim 0 must divide by world_size). Every rank's splits are
// exchanged first, so ones that do not pair up (rank r sends k rows to s, who expects j != k)
// end in the same error on every rank.
Work all_to_all_async(const ProcessGroup& group, at::Tensor output, at::Tensor input,
                      std::vector<int64_t> output_splits = {}, std::vector<int64_t> input_splits = {});
void all_to_all(const ProcessGroup& group, at::Tensor output, at::Tensor input,
                std::vector<int64_t> output_splits = {}, std::vector<int64_t> input_splits = {});
// PyTorch's name for it: all_to_all_single(output, input, output_split_sizes, input_split_sizes).
inline void all_to_all_single(const ProcessGroup& group, at::Tensor output, at::Tensor input,
                              std::vector<int64_t> output_splits = {}, std::vector<int64_t> input_splits = {}) {
  all_to_all(group, std::move(output), std::move(input), std::move(output_splits), std::move(input_splits));
}

// Rank `root`'s outputs[r] = rank r's input (every rank's input of one shape). Other ranks
// pass an empty `outputs`.
Work gather_async(const ProcessGroup& group, at::Tensor input, std::vector<at::Tensor> outputs, int root = 0);
void gather(const ProcessGroup& group, at::Tensor input, std::vector<at::Tensor> outputs, int root = 0);

// Rank r's output = rank `root`'s inputs[r] (every rank's output of one shape). Other ranks
// pass an empty `inputs`.
Work scatter_async(const ProcessGroup& group, at::Tensor output, std::vector<at::Tensor> inputs, int root = 0);
void scatter(const ProcessGroup& group, at::Tensor output, std::vector<at::Tensor> inputs, int root = 0);

// In place on rank `root` only: its `tensor` ends with the reduction of all ranks' `tensor`
// (the others' are left as they were).
Work reduce_async(const ProcessGroup& group, at::Tensor tensor, int root = 0, ReduceOp op = ReduceOp::kSum);
void reduce(const ProcessGroup& group, at::Tensor tensor, int root = 0, ReduceOp op = ReduceOp::kSum);

// outputs[r] = rank r's input, where each rank's input may have its own size (outputs[r] must
// have rank r's element count; the sizes are exchanged and checked first). Equal sizes are
// cheaper through all_gather_into. The size exchange blocks; the data moves asynchronously.
Work all_gather_async(const ProcessGroup& group, std::vector<at::Tensor> outputs, const at::Tensor& input);
void all_gather(const ProcessGroup& group, std::vector<at::Tensor> outputs, const at::Tensor& input);

}  // namespace cpprun
