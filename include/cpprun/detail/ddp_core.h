// The non-template part of DistributedDataParallel: everything but calling the wrapped module's
// forward. Users do not need this header's names.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cpprun/comm_hooks.h"
#include "cpprun/ddp_options.h"
#include "cpprun/detail/data_parallel_core.h"
#include "cpprun/process_group.h"

namespace cpprun::detail {

class DdpCore final : public DataParallelCore {
 public:
  DdpCore(torch::nn::Module& module, ProcessGroup group, DdpOptions options);
  ~DdpCore();
  DdpCore(const DdpCore&) = delete;
  DdpCore& operator=(const DdpCore&) = delete;

  // Around the wrapped module's forward. `outputs`: the tensors the forward returned, from
  // which parameters that take no part in the loss are found (find_unused_parameters).
  void before_forward() override;
  void after_forward(const std::vector<at::Tensor>& outputs) override;

  void set_require_sync(bool sync) override;
  bool require_sync() const override;
  // Manual finalization: forwards prepare no reduction and buckets are never rebuilt (they stay in
  // reverse registration order); begin_last_backward() lets the step's last backward reduce each
  // bucket once it is ready, and finalize_backward() reduces the rest and waits (all of them at
  // once without begin_last_backward). See Note [A pipeline stage's last backward] (ddp/reducer.cpp).
  void set_manual_finalization(bool on) override;
  void begin_last_backward() override;
  void finalize_backward() override;
  // The gradients are the same on every rank after backward: no communication.
  double clip_grad_norm(double max_norm, double norm_type, bool error_if_nonfinite) override;
  const ProcessGroup& group() const override;
  // Every rank holds the whole module (its tensor-parallel shards aside): replicated over the group.
  void describe_state(StateView& view) override;

  void register_comm_hook(std::shared_ptr<CommHook> hook);
  void join(const std::function<void()>& train_loop);
  const DdpOptions& options() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cpprun::detail
