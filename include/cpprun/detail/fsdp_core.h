// The non-template part of FullyShardedDataParallel. Users do not need this header's names.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <memory>
#include <string>
#include <vector>

#include "cpprun/detail/data_parallel_core.h"
#include "cpprun/fsdp_options.h"
#include "cpprun/fsdp_stats.h"
#include "cpprun/process_group.h"

namespace cpprun::detail {

class FsdpCore final : public DataParallelCore {
 public:
  FsdpCore(torch::nn::Module& module, ProcessGroup group, FsdpOptions options);
  ~FsdpCore();
  FsdpCore(const FsdpCore&) = delete;
  FsdpCore& operator=(const FsdpCore&) = delete;

  void before_forward() override;
  void after_forward(const std::vector<at::Tensor>& outputs) override;
  // Mixed precision: a floating-point input cast to param_dtype; anything else as it is.
  at::Tensor cast_input(const at::Tensor& input) const override;
  // Brings the full parameters up to date with the shards now (normally done by the next forward).
  void gather_full_parameters() override;
  // This rank's shards: what the optimizer must update (one per flat parameter).
  std::vector<at::Tensor> shards() const;
  void set_require_sync(bool sync) override;
  bool require_sync() const override;
  double clip_grad_norm(double max_norm) override;
  const ProcessGroup& group() const override;

  FsdpMemory memory() const;
  FsdpPrefetchStats prefetch_stats() const;
  std::size_t unit_count() const;            // wrapped modules (the root included)
  std::size_t flat_parameter_count() const;  // one per unit and dtype
  // Full (unsharded) state in torch::save's format for the wrapped module: rank 0 writes it
  // (atomically), and a plain module loads it with torch::load. Loading reads on rank 0 and
  // broadcasts, so only rank 0 needs the file. Collective.
  void save_full_state(const std::string& path);
  void load_full_state(const std::string& path);
  // Sharded: every rank writes DIR/rank_<r>.pt (its shards and their optimizer state), rank 0
  // DIR/meta.pt last; loading works at any world size. `optimizer` may be null. Collective.
  void save_sharded(const std::string& dir, torch::optim::Optimizer* optimizer);
  void load_sharded(const std::string& dir, torch::optim::Optimizer* optimizer);

  const FsdpOptions& options() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cpprun::detail
