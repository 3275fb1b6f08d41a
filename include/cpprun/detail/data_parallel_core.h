// The non-template part that DistributedDataParallel and FullyShardedDataParallel share: what
// cpprun::DataParallelImpl calls around the wrapped module's forward. Users do not need this
// header's names.
#pragma once

#include <ATen/core/Tensor.h>

#include <tuple>
#include <utility>
#include <vector>

#include "cpprun/process_group.h"

namespace cpprun::detail {

struct StateView;  // checkpoint/state_view.h

class DataParallelCore {
 public:
  virtual ~DataParallelCore() = default;

  virtual void before_forward() = 0;
  // A tensor argument as the wrapped module's forward gets it (FSDP's mixed precision casts it).
  virtual at::Tensor cast_input(const at::Tensor& input) const { return input; }
  // A tensor the wrapped module's forward returned, as the caller gets it (FSDP's output_dtype).
  virtual at::Tensor cast_output(const at::Tensor& output) const { return output; }
  // `outputs`: the tensors the forward returned (DDP finds unused parameters from them).
  virtual void after_forward(const std::vector<at::Tensor>& outputs) = 0;

  // Whether the next backward reduces gradients across ranks (what no_sync() switches off).
  virtual void set_require_sync(bool sync) = 0;
  virtual bool require_sync() const = 0;
  // HSDP's all-reduce across replicas (FSDP's set_requires_all_reduce); others have none.
  virtual void set_requires_all_reduce(bool /*all_reduce*/) {}
  virtual bool requires_all_reduce() const { return true; }
  // Pipelines (cpprun/pipeline.h): with manual finalization on, the backwards of a step's
  // micro-batches accumulate local gradients (as under no_sync) and finalize_backward() then
  // reduces what accumulated, once per step, after the stage's last backward (FSDP2's
  // set_manual_backward_finalization / finalize_backward). A wrapper that cannot says so, naming
  // what to use instead, from set_manual_finalization(true). Collective: finalize_backward.
  virtual void set_manual_finalization(bool on) = 0;
  // Under manual finalization, before the stage's last backward of the step: the wrapper may
  // start reducing in that backward what is ready (DDP's buckets), so that the reduction overlaps
  // the pipeline's remaining passes; finalize_backward() still ends it. The default starts nothing.
  virtual void begin_last_backward() {}
  virtual void finalize_backward() = 0;
  // The group whose ranks' gradients together hold each gradient once (FSDP's shard group), for a
  // norm over more than this wrapper (a pipeline's stages); null when each rank holds them all.
  virtual const ProcessGroup* shard_group() const { return nullptr; }
  virtual double clip_grad_norm(double max_norm, double norm_type, bool error_if_nonfinite) = 0;
  virtual void gather_full_parameters() {}
  virtual const ProcessGroup& group() const = 0;

  // Every checkpoint (cpprun/state_dict.h, cpprun/optimizer_state_dict.h, cpprun/model_checkpoint.h):
  // this rank's state as entries with placements (checkpoint/state_view.h), which the checkpoint
  // code gathers, writes, reads and scatters the same way for every wrapper. Not collective.
  virtual void describe_state(StateView& view) = 0;
};

// The tensors in a forward's result: a tensor, a vector of them, or a tuple/pair of them.
inline void collect_tensors(const at::Tensor& t, std::vector<at::Tensor>& out) { out.push_back(t); }
inline void collect_tensors(const std::vector<at::Tensor>& ts, std::vector<at::Tensor>& out) {
  out.insert(out.end(), ts.begin(), ts.end());
}
template <typename... T>
void collect_tensors(const std::tuple<T...>& tuple, std::vector<at::Tensor>& out) {
  std::apply([&](const auto&... item) { (collect_tensors(item, out), ...); }, tuple);
}
template <typename A, typename B>
void collect_tensors(const std::pair<A, B>& pair, std::vector<at::Tensor>& out) {
  collect_tensors(pair.first, out);
  collect_tensors(pair.second, out);
}
// Anything else holds no tensor we can see: unused parameters are then found when backward ends.
template <typename T>
void collect_tensors(const T&, std::vector<at::Tensor>&) {}

// The same walk, each tensor replaced by core.cast_output(tensor), in place.
inline void cast_outputs(at::Tensor& t, const DataParallelCore& core) { t = core.cast_output(t); }
inline void cast_outputs(std::vector<at::Tensor>& ts, const DataParallelCore& core) {
  for (auto& t : ts) t = core.cast_output(t);
}
template <typename... T>
void cast_outputs(std::tuple<T...>& tuple, const DataParallelCore& core) {
  std::apply([&](auto&... item) { (cast_outputs(item, core), ...); }, tuple);
}
template <typename A, typename B>
void cast_outputs(std::pair<A, B>& pair, const DataParallelCore& core) {
  cast_outputs(pair.first, core);
  cast_outputs(pair.second, core);
}
template <typename T>
void cast_outputs(T&, const DataParallelCore&) {}

}  // namespace cpprun::detail
