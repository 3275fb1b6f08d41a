// FullyShardedDataParallel's non-template part: plans units, flattens their parameters, and
// keeps the full parameters current (stages 1 and 2: all-gather after each optimizer step;
// stage 3: ParameterResidency's gather on use); gradient reduction is GradientSync's.
#include "cpprun/detail/fsdp_core.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/serialize/archive.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <unordered_map>

#include "cpprun/checkpoint_file.h"
#include "core/clip_grad_norm.h"
#include "cpprun/collectives.h"
#include "fsdp/failure_agreement.h"
#include "fsdp/flat_param.h"
#include "fsdp/gradient_sync.h"
#include "fsdp/parameter_residency.h"
#include "fsdp/sharded_checkpoint.h"
#include "fsdp/unit_plan.h"

namespace cpprun::detail {
namespace {

// Every parameter must belong to exactly one unit: a flat parameter owns its storage.
void check_not_shared(const std::vector<UnitPlan>& units) {
  std::unordered_map<const void*, std::string> owner;
  for (const auto& unit : units) {
    for (std::size_t i = 0; i < unit.params.size(); ++i) {
      auto [it, fresh] = owner.emplace(unit.params[i].unsafeGetTensorImpl(), unit.param_names[i]);
      TORCH_CHECK(fresh, "cpprun::FullyShardedDataParallel: parameter \"", unit.param_names[i], "\" is the same tensor as \"",
                  it->second, "\" (a shared or tied parameter). Each parameter must belong to one unit; tie them in "
                  "forward instead, or keep both modules in one unit (adjust wrap_policy / auto_wrap_min_params).");
    }
  }
}

// Reads `archive` into `module`'s tensors in place (Module::load would replace their storage,
// which here is a unit's flat parameter).
void copy_in(torch::nn::Module& module, torch::serialize::InputArchive& archive) {
  at::NoGradGuard no_grad;
  for (auto& item : module.named_parameters(/*recurse=*/false)) {
    at::Tensor value;
    archive.read(item.key(), value);
    TORCH_CHECK(value.sizes() == item.value().sizes(), "cpprun::FullyShardedDataParallel: checkpoint tensor \"",
                item.key(), "\" has shape ", value.sizes(), " but the module's has ", item.value().sizes(), ".");
    item.value().copy_(value);
  }
  for (auto& item : module.named_buffers(/*recurse=*/false)) {
    at::Tensor value;
    archive.read(item.key(), value, /*is_buffer=*/true);
    item.value().copy_(value);
  }
  for (auto& child : module.named_children()) {
    torch::serialize::InputArchive sub;
    archive.read(child.key(), sub);
    copy_in(*child.value(), sub);
  }
}

}  // namespace

struct FsdpCore::Impl {
  torch::nn::Module& module;
  ProcessGroup group;
  FsdpOptions options;
  std::vector<FlatParam> flats;  // never resized after construction: GradientSync refers to them
  std::unique_ptr<ParameterResidency> residency;  // stage 3; before `sync`, whose hooks call it
  std::unique_ptr<GradientSync> sync;
  std::size_t unit_count = 0;
  bool require_sync = true;
  bool shards_loaded = false;  // a checkpoint wrote the shards: gather before the next forward

  Impl(torch::nn::Module& m, ProcessGroup g, FsdpOptions o) : module(m), group(std::move(g)), options(std::move(o)) {}

  // After an optimizer step each rank has updated only its shard: gather the full parameters.
  void gather_if_stepped() {
    if (residency) return;  // stage 3 gathers on use
    const bool stepped = sync->take_shards_stepped();
    const bool loaded = std::exchange(shards_loaded, false);
    if (!stepped && !loaded) return;
    for (auto& flat : flats) {
      // The input must not alias the output (a shard may be part of full()); cast for mixed precision.
      at::Tensor shard = flat.shard().detach();
      all_gather_into(group, flat.full(), flat.shard_is_separate() ? shard.to(flat.full().scalar_type()) : shard.clone());
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

  // Start from rank 0's parameters and buffers everywhere.
  std::vector<at::Tensor> state;
  for (const auto& p : module.parameters()) state.push_back(p);
  for (const auto& b : module.buffers()) state.push_back(b);
  broadcast_coalesced(s.group, state, 0);

  const auto units = plan_units(module, s.options);
  TORCH_CHECK(!units.empty(), "cpprun::FullyShardedDataParallel: the module has no parameter that requires grad.");
  check_not_shared(units);
  s.unit_count = units.size();
  s.flats.reserve(units.size() * 2);
  std::vector<bool> root;  // per flat: holds the top-level module's own parameters
  for (const auto& unit : units) {
    // One flat parameter per dtype and device within the unit, parameters in their order.
    std::map<std::string, std::pair<std::vector<std::string>, std::vector<at::Tensor>>> by_kind;
    std::vector<std::string> kinds;
    for (std::size_t i = 0; i < unit.params.size(); ++i) {
      const auto& p = unit.params[i];
      const std::string kind = std::string(c10::toString(p.scalar_type())) + "/" + p.device().str();
      if (!by_kind.count(kind)) kinds.push_back(kind);
      by_kind[kind].first.push_back(unit.param_names[i]);
      by_kind[kind].second.push_back(p);
    }
    for (const auto& kind : kinds) {
      s.flats.emplace_back(by_kind[kind].first, by_kind[kind].second, s.group.rank(), s.group.size(),
                           s.options.param_dtype(), /*separate_shard=*/stage == 3, s.options.cpu_offload());
      // Stage 3: the unit's full parameters go now, so that wrapping a model never holds more
      // than the model plus one unit.
      if (stage == 3) s.flats.back().release_full();
      root.push_back(unit.name.empty());
    }
  }
  std::function<void(std::size_t)> unit_done;
  if (stage == 3) {
    ResidencyOptions residency;
    residency.reshard_after_forward = s.options.reshard_after_forward();
    residency.prefetch = s.options.prefetch();
    residency.limit = s.options.gathered_unit_limit();
    s.residency = std::make_unique<ParameterResidency>(s.flats, root, s.group, residency);
    unit_done = [r = s.residency.get()](std::size_t f) { r->backward_done(f); };
  }
  s.sync = std::make_unique<GradientSync>(s.flats, s.group, stage,
                                          s.options.reduce_dtype() ? s.options.reduce_dtype() : s.options.param_dtype(),
                                          std::move(unit_done),
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
  // The shards together cover every gradient exactly once.
  return detail::clip_grad_norm(grads, max_norm, &impl_->group, "cpprun::FullyShardedDataParallel");
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
  Impl& s = *impl_;
  gather_full_parameters();  // collective: every rank takes part
  std::exception_ptr failure;
  if (s.group.rank() == 0) {
    try {
      torch::serialize::OutputArchive archive;
      s.module.save(archive);
      save_checkpoint(archive, path);  // atomic, with a checksum; torch::load still reads it
    } catch (...) {
      failure = std::current_exception();
    }
  }
  if (s.residency) s.residency->release_all();
  // Also the barrier: the file exists when save returns, on every rank.
  agree_on_failure(s.group, failure, "saving the full state dict to " + path);
}

void FsdpCore::load_full_state(const std::string& path) {
  Impl& s = *impl_;
  gather_full_parameters();
  std::exception_ptr failure;
  if (s.group.rank() == 0) {
    try {
      torch::serialize::InputArchive archive;
      // Our own files are checked; one torch::save wrote carries no checksum and is read as it is.
      load_checkpoint(archive, path, UncheckedFiles::kAccept);
      copy_in(s.module, archive);
    } catch (...) {
      failure = std::current_exception();
    }
  }
  try {
    // Only rank 0 reads: the others must not wait for its broadcast if it could not.
    agree_on_failure(s.group, failure, "loading the full state dict from " + path);
  } catch (...) {
    if (s.residency) s.residency->release_all();
    throw;
  }
  std::vector<at::Tensor> state;
  for (const auto& p : s.module.parameters()) state.push_back(p);
  for (const auto& b : s.module.buffers()) state.push_back(b);
  broadcast_coalesced(s.group, state, 0);
  // Where a shard is not a part of the full parameters (stage 3, mixed precision), copy it over.
  for (auto& flat : s.flats) flat.shard_from_full();
  if (s.residency) s.residency->release_all();
}

void FsdpCore::save_sharded(const std::string& dir, torch::optim::Optimizer* optimizer) {
  save_sharded_checkpoint(impl_->flats, impl_->group, optimizer, dir);
}

void FsdpCore::load_sharded(const std::string& dir, torch::optim::Optimizer* optimizer) {
  load_sharded_checkpoint(impl_->flats, impl_->group, optimizer, dir);
  impl_->shards_loaded = true;
}

void FsdpCore::set_require_sync(bool sync) { impl_->require_sync = sync; }
bool FsdpCore::require_sync() const { return impl_->require_sync; }
const ProcessGroup& FsdpCore::group() const { return impl_->group; }
const FsdpOptions& FsdpCore::options() const { return impl_->options; }

}  // namespace cpprun::detail
