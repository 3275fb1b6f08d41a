// FullyShardedDataParallel's non-template part: wires its pieces together. Units are planned
// (unit_plan.h) and flattened (flat_param.h); the full parameters are kept current (stages 1 and
// 2: all-gathered after each optimizer step; stage 3: ParameterResidency's gather on use);
// gradients are reduced by GradientSync; checkpoints are checkpoint.h's.
#include "cpprun/detail/fsdp_core.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <functional>

#include "core/clip_grad_norm.h"
#include "cpprun/collectives.h"
#include "fsdp/checkpoint.h"
#include "fsdp/deferred_units.h"
#include "fsdp/flat_param.h"
#include "fsdp/gradient_sync.h"
#include "fsdp/parameter_residency.h"
#include "fsdp/shard_groups.h"
#include "fsdp/unit_plan.h"

namespace cpprun::detail {

namespace {

// Stage 3: releases every gathered unit when a checkpoint is done with them, however it ends.
class ReleaseAfter {
 public:
  explicit ReleaseAfter(ParameterResidency* residency) : residency_(residency) {}
  ~ReleaseAfter() {
    if (residency_) residency_->release_all();
  }
  ReleaseAfter(const ReleaseAfter&) = delete;
  ReleaseAfter& operator=(const ReleaseAfter&) = delete;

 private:
  ParameterResidency* residency_;
};

}  // namespace

struct FsdpCore::Impl {
  torch::nn::Module& module;
  ProcessGroup group;
  FsdpOptions options;
  ShardGroups groups;  // HSDP: shard within groups.shard, replicate across groups.replicate
  std::vector<FlatParam> flats;  // never resized after construction: GradientSync refers to them
  std::unique_ptr<ParameterResidency> residency;  // stage 3; before `sync`, whose hooks call it
  std::unique_ptr<GradientSync> sync;
  std::size_t unit_count = 0;
  bool require_sync = true;
  bool shards_loaded = false;  // a checkpoint wrote the shards: gather before the next forward

  Impl(torch::nn::Module& m, ProcessGroup g, FsdpOptions o)
      : module(m), group(std::move(g)), options(std::move(o)), groups(make_shard_groups(group, options)) {}

  // After an optimizer step each rank has updated only its shard: gather the full parameters.
  void gather_if_stepped() {
    if (residency) return;  // stage 3 gathers on use
    const bool stepped = sync->take_shards_stepped();
    const bool loaded = std::exchange(shards_loaded, false);
    if (!stepped && !loaded) return;
    for (auto& flat : flats) {
      // The input must not alias the output (a shard may be part of full()); cast for mixed precision.
      at::Tensor shard = flat.shard().detach();
      all_gather_into(groups.shard, flat.full(), flat.shard_is_separate() ? shard.to(flat.full().scalar_type()) : shard.clone());
    }
  }
};

FsdpCore::FsdpCore(torch::nn::Module& module, ProcessGroup group, FsdpOptions options)
    : impl_(std::make_unique<Impl>(module, std::move(group), std::move(options))) {
  Impl& s = *impl_;
  const int stage = s.options.stage();
  TORCH_CHECK(stage >= 1 && stage <= 3, "cpprun::FullyShardedDataParallel: stage must be 1, 2 or 3 (the ZeRO "
              "stages), got ", stage, ".");
  TORCH_CHECK(!s.options.cpu_offload() || stage == 3, "cpprun::FullyShardedDataParallel: cpu_offload needs stage 3 "
              "(it offloads the parameter shards), got stage ", stage, ".");
  TORCH_CHECK(s.options.gathered_unit_limit() >= 1, "cpprun::FullyShardedDataParallel: gathered_unit_limit must be "
              "at least 1, got ", s.options.gathered_unit_limit(), ".");
  TORCH_CHECK(s.options.auto_wrap_min_params() >= 0, "cpprun::FullyShardedDataParallel: auto_wrap_min_params must "
              "not be negative, got ", s.options.auto_wrap_min_params(), ".");

  const auto units = plan_units(module, s.options);
  s.unit_count = units.size();
  // Start from rank 0's parameters and buffers everywhere; a deferred module is materialised unit by
  // unit as it is flattened, each broadcast then.
  std::unique_ptr<DeferredUnits> deferred;
  if (has_deferred_state(module)) {
    deferred = std::make_unique<DeferredUnits>(module, units, s.group);
    deferred->materialize_rest();
  } else {
    broadcast_module_state(module, s.group);
  }
  FlattenOptions flatten;
  flatten.rank = s.groups.shard.rank();
  flatten.world = s.groups.shard.size();
  flatten.compute_dtype = s.options.param_dtype();
  flatten.separate_shard = flatten.release_full = stage == 3;
  flatten.shard_on_cpu = s.options.cpu_offload();
  if (deferred) flatten.before_unit = [&deferred](std::size_t u) { deferred->materialize_unit(u); };
  std::vector<bool> root;  // per flat parameter: holds the top-level module's own parameters
  s.flats = flatten_units(units, flatten, root);

  std::function<void(std::size_t)> flat_done;
  if (stage == 3) {
    ResidencyOptions residency;
    residency.reshard_after_forward = s.options.reshard_after_forward();
    residency.prefetch = s.options.prefetch();
    residency.limit = s.options.gathered_unit_limit();
    s.residency = std::make_unique<ParameterResidency>(s.flats, root, s.groups.shard, residency);
    flat_done = [r = s.residency.get()](std::size_t f) { r->backward_done(f); };
  }
  s.sync = std::make_unique<GradientSync>(s.flats, s.groups, stage,
                                          s.options.reduce_dtype() ? s.options.reduce_dtype() : s.options.param_dtype(),
                                          std::move(flat_done),
                                          static_cast<std::size_t>(s.options.gathered_unit_limit() - 1));
  if (s.residency) s.sync->on_backward_end([r = s.residency.get()] { r->end_backward(); });
}

FsdpCore::~FsdpCore() = default;

void FsdpCore::before_forward() {
  Impl& s = *impl_;
  if (s.residency) s.residency->begin_forward();
  s.gather_if_stepped();
  if (torch::autograd::GradMode::is_enabled()) s.sync->prepare(s.require_sync);
}

void FsdpCore::after_forward(const std::vector<at::Tensor>& /*outputs*/) {
  if (impl_->residency) impl_->residency->end_forward(torch::autograd::GradMode::is_enabled());
}

void FsdpCore::gather_full_parameters() {
  if (impl_->residency) impl_->residency->gather_all();
  impl_->gather_if_stepped();
}

std::vector<at::Tensor> FsdpCore::shards() const {
  std::vector<at::Tensor> out;
  for (const auto& flat : impl_->flats) out.push_back(flat.shard());
  return out;
}

double FsdpCore::clip_grad_norm(double max_norm) {
  std::vector<at::Tensor> grads;
  for (const auto& flat : impl_->flats) grads.push_back(flat.shard().grad());
  // The shard group's shards cover every gradient exactly once (HSDP: replicas hold equal ones).
  return detail::clip_grad_norm(grads, max_norm, &impl_->groups.shard, "cpprun::FullyShardedDataParallel");
}

at::Tensor FsdpCore::cast_input(const at::Tensor& input) const {
  const auto& dtype = impl_->options.param_dtype();
  if (!dtype || !input.defined() || !input.is_floating_point() || input.scalar_type() == *dtype) return input;
  return input.to(*dtype);
}

FsdpMemory FsdpCore::memory() const {
  const Impl& s = *impl_;
  FsdpMemory m;
  for (const auto& flat : s.flats) {
    m.parameters += static_cast<int64_t>(flat.full().storage().nbytes());
    if (flat.shard_is_separate()) m.shards += flat.shard().nbytes();
  }
  m.peak_parameters = s.residency ? s.residency->peak_gathered_bytes() : m.parameters;
  m.gradients = s.sync->gradient_bytes();
  m.peak_gradients = s.sync->peak_gradient_bytes();
  m.kept = s.sync->kept_bytes() + (s.residency ? s.residency->kept_bytes() : 0);
  return m;
}

std::size_t FsdpCore::unit_count() const { return impl_->unit_count; }
std::size_t FsdpCore::flat_parameter_count() const { return impl_->flats.size(); }

FsdpPrefetchStats FsdpCore::prefetch_stats() const {
  FsdpPrefetchStats stats;
  if (impl_->residency) impl_->residency->prefetch_stats(stats.started, stats.used);
  return stats;
}

void FsdpCore::save_full_state(const std::string& path) {
  gather_full_parameters();  // collective: every rank takes part
  ReleaseAfter release(impl_->residency.get());
  detail::save_full_state(impl_->module, impl_->group, path);
}

void FsdpCore::load_full_state(const std::string& path) {
  gather_full_parameters();
  ReleaseAfter release(impl_->residency.get());
  detail::load_full_state(impl_->module, impl_->flats, impl_->group, path);
}

void FsdpCore::save_sharded(const std::string& dir, torch::optim::Optimizer* optimizer) {
  save_sharded_checkpoint(impl_->flats, impl_->groups, optimizer, dir);
}

void FsdpCore::load_sharded(const std::string& dir, torch::optim::Optimizer* optimizer) {
  load_sharded_checkpoint(impl_->flats, impl_->groups, optimizer, dir);
  impl_->shards_loaded = true;
}

void FsdpCore::set_require_sync(bool sync) { impl_->require_sync = sync; }
bool FsdpCore::require_sync() const { return impl_->require_sync; }
const ProcessGroup& FsdpCore::group() const { return impl_->group; }
const FsdpOptions& FsdpCore::options() const { return impl_->options; }

}  // namespace cpprun::detail
