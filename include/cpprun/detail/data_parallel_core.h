// The non-template part that DistributedDataParallel and FullyShardedDataParallel share: what
// cpprun::DataParallelImpl calls around the wrapped module's forward. Users do not need this
// header's names.
#pragma once

#include <ATen/core/Tensor.h>

#include <tuple>
#include <utility>
#include <vector>

#include "cpprun/process_group.h"

namespace torch::nn {
class Module;
}  // namespace torch::nn

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

// While a wrapper (DataParallelImpl) lives, the free cpprun::clip_grad_norm_ given it as a module
// clips with its core's clip_grad_norm, over its ranks (core/clip_grad_norm.cpp keeps the list).
void register_data_parallel(const torch::nn::Module& wrapper, DataParallelCore& core);
void unregister_data_parallel(const torch::nn::Module& wrapper);

// Calls fn(tensor&) on each tensor in a forward's result: a tensor, a vector of them, or a tuple or
// pair of such; anything else holds no tensor we can see (DDP then finds unused parameters when
// backward ends). DataParallelImpl::forward casts them (FSDP's output_dtype), then collects them.
// Declared first, so that a tuple of pairs (or of ints) finds every overload.
template <typename Fn>
void for_each_output(at::Tensor& t, Fn&& fn);
template <typename Fn>
void for_each_output(std::vector<at::Tensor>& ts, Fn&& fn);
template <typename Fn, typename... T>
void for_each_output(std::tuple<T...>& tuple, Fn&& fn);
template <typename Fn, typename A, typename B>
void for_each_output(std::pair<A, B>& pair, Fn&& fn);
template <typename Fn, typename T>
void for_each_output(T&, Fn&&);

template <typename Fn>
void for_each_output(at::Tensor& t, Fn&& fn) {
  fn(t);
}
template <typename Fn>
void for_each_output(std::vector<at::Tensor>& ts, Fn&& fn) {
  for (auto& t : ts) fn(t);
}
template <typename Fn, typename... T>
void for_each_output(std::tuple<T...>& tuple, Fn&& fn) {
  std::apply([&](auto&... item) { (for_each_output(item, fn), ...); }, tuple);
}
template <typename Fn, typename A, typename B>
void for_each_output(std::pair<A, B>& pair, Fn&& fn) {
  for_each_output(pair.first, fn);
  for_each_output(pair.second, fn);
}
template <typename Fn, typename T>
void for_each_output(T&, Fn&&) {}

}  // namespace cpprun::detail
