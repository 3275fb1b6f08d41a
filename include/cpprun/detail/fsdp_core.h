// The non-template part of FullyShardedDataParallel. Users do not need this header's names.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <memory>
#include <string>
#include <vector>

#include "cpprun/detail/sync_switch.h"
#include "cpprun/fsdp_options.h"
#include "cpprun/process_group.h"

namespace cpprun::detail {

// Per-rank bytes held in each kind of training state, for the memory accounting.
struct FsdpMemory {
  int64_t parameters = 0;  // what the module computes with (full, or the units gathered now)
  int64_t shards = 0;      // the optimizer's parameters, where they are not views of the above
  int64_t gradients = 0;   // gradients held between backward and the next one
  int64_t peak_parameters = 0;  // the most `parameters` (plus the kept part of `kept`) has been
  int64_t peak_gradients = 0;   // the same for `gradients` (full flat gradients live in backward)
  int64_t kept = 0;  // stages 2 and 3: released full parameters and gradients kept for reuse
};

class FsdpCore : public SyncSwitch {
 public:
  FsdpCore(torch::nn::Module& module, ProcessGroup group, FsdpOptions options);
  ~FsdpCore();
  FsdpCore(const FsdpCore&) = delete;
  FsdpCore& operator=(const FsdpCore&) = delete;

  void before_forward();
  void after_forward();
  // Mixed precision: a floating-point input cast to param_dtype; anything else as it is.
  at::Tensor cast_input(const at::Tensor& input) const;
  // Brings the full parameters up to date with the shards now (normally done by the next forward).
  void gather_full_parameters();
  // This rank's shards: what the optimizer must update (one flat tensor per unit and dtype).
  std::vector<at::Tensor> shards() const;
  void set_require_sync(bool sync) override;
  bool require_sync() const override;
  double clip_grad_norm(double max_norm);
  FsdpMemory memory() const;
  std::size_t unit_count() const;
  // Stage 3, since construction: all-gathers started ahead of use (prefetch), and how many of
  // those units were then used before being released.
  struct PrefetchStats {
    int64_t started = 0;
    int64_t used = 0;
  };
  PrefetchStats prefetch_stats() const;
  // Full (unsharded) state in torch::save's format for the wrapped module: rank 0 writes it
  // (atomically), and a plain module loads it with torch::load. Loading reads on rank 0 and
  // broadcasts, so only rank 0 needs the file. Collective.
  void save_full_state(const std::string& path);
  void load_full_state(const std::string& path);
  // Sharded: every rank writes DIR/rank_<r>.pt (its shards and their optimizer state), rank 0
  // DIR/meta.pt last; loading works at any world size. `optimizer` may be null. Collective.
  void save_sharded(const std::string& dir, torch::optim::Optimizer* optimizer);
  void load_sharded(const std::string& dir, torch::optim::Optimizer* optimizer);

  const ProcessGroup& group() const;
  const FsdpOptions& options() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace cpprun::detail
