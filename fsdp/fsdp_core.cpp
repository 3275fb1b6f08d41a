// FullyShardedDataParallel's non-template part: wires its pieces together. Units are planned
// (unit_plan.h) and their parameters sharded (param_bucket.h); the full parameters are kept
// current (stages 1 and 2: all-gathered after each optimizer step; stage 3: ParameterResidency's
// gather on use); gradients are reduced by GradientSync; checkpoints see the shards through
// describe_state (checkpoint/state_view.h). What differs between the ZeRO stages is decided once,
// in FsdpStageBehaviour.
#include "cpprun/detail/fsdp_core.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <cmath>
#include <exception>
#include <functional>
#include <span>
#include <sstream>
#include <string>
#include <vector>
#include <unordered_map>
#include <unordered_set>

#include "comm/group_membership.h"
#include "comm/public_call.h"
#include "core/clip_grad_norm.h"
#include "core/failure_agreement.h"
#include "cpprun/collectives.h"
#include "cpprun/object_collectives.h"
#include "checkpoint/state_view.h"
#include "core/tensor_parallel_splits.h"
#include "core/wrapped_parameters.h"
#include "fsdp/deferred_units.h"
#include "fsdp/fsdp_collectives.h"
#include "fsdp/full_parameter_writes.h"
#include "fsdp/param_bucket.h"
#include "fsdp/gradient_sync.h"
#include "fsdp/parameter_residency.h"
#include "fsdp/shard_groups.h"
#include "fsdp/unit_plan.h"

namespace cpprun::detail {

// Everything the ZeRO stage decides, in one place. Outside the anonymous namespace because
// FsdpCore::Impl (declared in the header) holds one.
struct FsdpStageBehaviour {
  bool shard_gradients;   // gradients held until reduced, then dropped (2, 3), not one kept full gradient (1)
  bool shard_parameters;  // full parameters exist only while used (3): gathered on use
};

// A parameter frozen when wrapped: the module's, and its shard (Note [A parameter unfrozen after
// wrapping]).
struct FsdpFrozenParameter {
  std::string name;
  at::Tensor param, shard;
};

namespace {

// Rank 0's parameters and buffers of `module` on every rank of `group`.
void broadcast_module_state(torch::nn::Module& module, const ProcessGroup& group) {
  std::vector<at::Tensor> state;
  for (const auto& p : module.parameters()) state.push_back(p);
  for (const auto& b : module.buffers()) state.push_back(b);
  broadcast_coalesced(group, state, 0);
}

// Note [Nothing to shard alone]
// In a shard group of one rank, this rank's shard of every parameter is the whole parameter. At
// stage 3, releasing the full parameters after each use and gathering them again would free
// nothing (the shard holds as much) and cost a copy of every parameter in forward and another in
// backward, plus the shard itself beside the gathered copy. So there the parameters stay whole
// and the shards are views of them, as at stages 1 and 2: nothing is gathered, nothing released.
// Mixed precision (the compute copy is another dtype: releasing it frees memory) and CPU offload
// (the shard lives on the host) keep the gather on use. The gradients' side is GradientSync's
// (Note [Nothing to reduce-scatter alone] in gradient_sync.cpp).
FsdpStageBehaviour behaviour_of(const FsdpOptions& options, int shard_world) {
  const int stage = options.stage();
  TORCH_CHECK(stage >= 1 && stage <= 3, "cpprun::FullyShardedDataParallel: stage must be 1, 2 or 3 (the ZeRO "
              "stages), got ", stage, ".");
  const bool alone = shard_world == 1 && !options.param_dtype() && !options.cpu_offload();
  return FsdpStageBehaviour{stage >= 2, stage == 3 && !alone};
}

}  // namespace

struct FsdpCore::Impl {
  torch::nn::Module& module;
  ProcessGroup group;
  FsdpOptions options;
  ShardGroups groups;  // HSDP: shard within groups.shard, replicate across groups.replicate
  FsdpStageBehaviour stage;
  std::vector<ParamBucket> buckets;  // never resized after construction: the others refer to them
  std::unique_ptr<ParameterResidency> residency;  // stage 3; before `sync`, whose hooks call it
  std::unique_ptr<GradientSync> sync;
  std::size_t unit_count = 0;
  bool require_sync = true;
  bool manual_finalization = false;  // a pipeline stage: finalize_backward() reduces, once a step
  bool step_open = false;            // a pipeline step's first forward ran; finalize_backward closes it
  bool shards_loaded = false;  // a checkpoint wrote the shards: gather before the next forward
  // Parameters split by tensor parallelism, by name (cpprun/tensor_parallel_split.h): FSDP
  // shards this rank's TP shard; clipping sums their squares over the TP group too.
  std::map<std::string, TensorParallelSplit> tp_splits;
  // This rank's shards, by name: the free clip_grad_norm_ refuses them (Note [Clipping a wrapper's
  // gradients] in core/clip_grad_norm.cpp).
  std::vector<std::pair<std::string, at::Tensor>> shards;
  // The module's parameters it took and the shards, noted while it lives (Note [One data-parallel
  // wrapper per parameter]).
  std::unique_ptr<WrappedParameters> wrapped;
  std::size_t trainable_buckets = 0;  // buckets[0, trainable_buckets): the rest are frozen (shard_units)
  // The parameters frozen when wrapped (Note [A parameter unfrozen after wrapping]).
  std::vector<FsdpFrozenParameter> frozen;
  // ZeRO-1/2: each bucket's shards' versions summed at its last all-gather; a user's in-place
  // write to the shards (model->parameters()) changes them, and the next forward gathers again.
  std::vector<int64_t> shard_versions;
  // ZeRO-1/2 under mixed precision: writes to the compute copies are refused (Note [In-place
  // writes to full parameters] in full_parameter_writes.cpp).
  std::unique_ptr<ComputeCopyVersions> compute_copies;

  Impl(torch::nn::Module& m, ProcessGroup g, const std::optional<DeviceMesh>& mesh, FsdpOptions o)
      : module(m),
        group(std::move(g)),
        options(std::move(o)),
        groups(make_shard_groups(group, mesh, options.shard_dim())),
        stage(behaviour_of(options, groups.shard.size())),
        tp_splits(tensor_parallel_splits(m)) {}
  ~Impl() { unregister_partial_gradients(shards); }

  // After an optimizer step each rank has updated only its shard: gather the full parameters.
  // A synchronized backward is taken to be followed by a step before the next forward, which
  // alone ends that window: a gather_full_parameters() in it may come before the step, so the
  // forward gathers again (Note [Stale gathered units] in parameter_residency.cpp).
  // So does a user's in-place write to the shards, which their version counters show (the
  // optimizer's steps, through .data(), do not: Note [Stale gathered units] in
  // parameter_residency.cpp); under mixed precision a write to the compute copies is refused first.
  void gather_if_stepped(bool ends_window) {
    if (residency) return;  // stage 3 gathers on use
    if (compute_copies) compute_copies->refuse_writes(buckets, groups.shard.rank());
    const bool stepped = ends_window ? sync->take_shards_stepped() : sync->shards_stepped();
    const bool loaded = std::exchange(shards_loaded, false);
    std::vector<int64_t> versions(buckets.size());
    std::vector<bool> gather(buckets.size(), false);
    std::vector<std::size_t> by_version;  // the buckets whose verdict is this rank's versions
    for (std::size_t b = 0; b < buckets.size(); ++b) {
      // Alone, a shard that is a view of the full parameter is it: nothing to copy, nor even the
      // views per parameter copy_shards_into() would make to find that out.
      if (groups.shard.size() == 1 && !buckets[b].shards_are_separate()) continue;
      versions[b] = shard_version_sum(buckets[b]);
      // The optimizer steps no frozen shard: only a load or a write changes one.
      if (loaded || (stepped && !buckets[b].frozen())) {
        gather[b] = true;
      } else {
        gather[b] = versions[b] != shard_versions[b];
        by_version.push_back(b);
      }
    }
    // Versions are this rank's own: agreed before anyone gathers (Note [Shard writes seen on one
    // rank] in fsdp_collectives.cpp); after a step too, for the frozen buckets (a write to a frozen
    // shard on one rank made the ranks' gathers differ, and the job abort: an audit, 2026-12-07).
    // Which buckets these are depends only on what every rank knows alike.
    if (!by_version.empty()) {
      std::vector<bool> written;
      for (std::size_t b : by_version) written.push_back(gather[b]);
      written = changed_on_any_rank(groups.shard, written);
      for (std::size_t i = 0; i < by_version.size(); ++i) gather[by_version[i]] = written[i];
    }
    for (std::size_t b = 0; b < buckets.size(); ++b) {
      if (!gather[b]) continue;
      all_gather_shards(groups.shard, buckets[b], buckets[b].unsharded()).wait();
      shard_versions[b] = versions[b];
    }
  }
  static int64_t shard_version_sum(const ParamBucket& bucket) {
    int64_t sum = 0;
    for (const auto& p : bucket.params()) sum += static_cast<int64_t>(p.shard._version());
    return sum;
  }
};

namespace {

// The buckets in the order a backward finishes them: the reverse of the units' pre-order, a
// unit's buckets last to first (Note [FSDP reduction order] in gradient_sync.cpp).
std::vector<std::size_t> reduction_order(std::span<const ParamBucket> buckets, const std::vector<UnitPlan>& units) {
  std::vector<std::size_t> order(buckets.size());
  for (std::size_t b = 0; b < order.size(); ++b) order[b] = order.size() - 1 - b;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return units[buckets[a].unit()].preorder > units[buckets[b].unit()].preorder;
  });
  return order;
}

// Note [A parameter unfrozen after wrapping]
// Frozen parameters are sharded and gathered like the others (as FSDP2 does), in buckets of their
// own that GradientSync does not hook: nothing reduces their gradients. One made trainable after
// wrapping (the module's parameter, or its shard in model->parameters()) would get a gradient that
// nothing averaged, or none at all, and each rank would step its own copy or nothing (an audit,
// 2026-12-07). FSDP2 decides per backward which parameters have gradients to reduce, so unfreezing
// one there trains it; here it is refused at the next training forward, naming it.
void refuse_unfrozen_parameters(const std::vector<FsdpFrozenParameter>& frozen) {
  for (const auto& p : frozen) {
    TORCH_CHECK(!p.param.requires_grad() && !p.shard.requires_grad(), "cpprun::FullyShardedDataParallel: the "
                "parameter \"", p.name, "\" was frozen (requires_grad false) when the module was wrapped and requires "
                "grad now. FSDP reduces the gradients of the parameters that required grad when it wrapped them, so "
                "nothing would average its gradient and the ranks would train it apart. Set requires_grad before "
                "wrapping (to train a parameter only later, leave it out of the optimizer until then).");
  }
}

// Note [A module moved after wrapping]
// The module's parameters are views of their bucket's memory (ParamBucket), which FSDP gathers
// into and reduces gradients from. module->to(dtype or device) after wrapping gives each parameter
// new memory (set_data): the forward then computes on copies FSDP neither gathers nor trains, and
// the optimizer's shards never get a gradient. PyTorch's FSDP2 follows a moved module (its
// parameters are DTensors it converts too); cpprun refuses, at the next forward, rather than train
// nothing without a word.
void refuse_moved_parameters(const std::vector<ParamBucket>& buckets) {
  for (const auto& bucket : buckets) {
    const c10::StorageImpl* memory = bucket.unsharded().storage().unsafeGetStorageImpl();
    for (const auto& p : bucket.params()) {
      if (p.param.storage().unsafeGetStorageImpl() == memory) continue;
      TORCH_CHECK(false, "cpprun::FullyShardedDataParallel: the parameter \"", p.name, "\" is no longer in FSDP's ",
                  "memory (", p.param.scalar_type(), " on ", p.param.device(), "; FSDP holds it as ",
                  bucket.unsharded().scalar_type(), " on ", bucket.unsharded().device(), "): the module was moved or ",
                  "converted after it was wrapped (module->to(...), or set_data on a parameter), so its forward would ",
                  "compute on a copy that FSDP neither gathers nor trains. Call to() before wrapping it; to compute ",
                  "in another dtype, use mixed precision (FsdpOptions::param_dtype).");
    }
  }
}

// Note [One FSDP configuration on every rank]
// Ranks that wrap differently (another stage, wrap policy, dtype, offload, or another model) would
// issue different collectives: a wait until the group's timeout, or a size mismatch found on the
// communication thread, where no try can catch it and the process aborts. So the ranks compare
// what they will do as they wrap, before the first collective that depends on it, and each refuses
// a difference, naming the rank and the first line that differs.
std::vector<std::string> describe_wrapping(const std::vector<UnitPlan>& units, const FsdpOptions& o) {
  const auto dtype = [](const std::optional<at::ScalarType>& t) { return t ? std::string(c10::toString(*t)) : "-"; };
  std::vector<std::string> lines;
  std::ostringstream line;
  line << "stage " << o.stage() << ", param_dtype " << dtype(o.param_dtype()) << ", reduce_dtype "
       << dtype(o.reduce_dtype()) << ", reshard_after_forward " << o.reshard_after_forward() << ", prefetch "
       << o.prefetch() << ", gathered_unit_limit " << o.gathered_unit_limit() << ", cpu_offload " << o.cpu_offload()
       << ", shard_dim '" << o.shard_dim() << "', " << units.size() << " units";
  lines.push_back(line.str());
  for (const auto& unit : units) {
    std::ostringstream u;
    u << "unit '" << unit.name << "':";
    for (std::size_t i = 0; i < unit.params.size(); ++i) {
      u << " " << unit.param_names[i] << " " << unit.params[i].scalar_type() << unit.params[i].sizes()
        << (unit.params[i].requires_grad() ? "" : " frozen");
    }
    lines.push_back(u.str());
  }
  return lines;
}

// `local_failure`: this rank's own checks refused its options; it is rethrown here after the
// exchange, so that the others learn of it instead of waiting for this rank.
void check_ranks_wrap_alike(const ProcessGroup& group, const std::vector<std::string>& lines,
                            std::exception_ptr local_failure) {
  // describe_failure's first letter is the failure's kind; its message follows.
  std::string mine = local_failure ? "refused: " + describe_failure(local_failure).substr(1) : "";
  for (const auto& line : lines) mine += line + '\n';
  const std::vector<std::string> all = all_gather_bytes(group, mine);
  if (local_failure) std::rethrow_exception(local_failure);
  for (std::size_t r = 0; r < all.size(); ++r) {
    TORCH_CHECK(all[r].rfind("refused: ", 0) != 0, "cpprun::FullyShardedDataParallel: rank ", r, " refused its "
                "options, so no rank wraps: ", all[r].substr(9));
  }
  const auto split = [](const std::string& text) {
    std::vector<std::string> out;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) out.push_back(line);
    return out;
  };
  for (std::size_t r = 1; r < all.size(); ++r) {
    if (all[r] == all[0]) continue;
    const std::vector<std::string> theirs = split(all[r]), first = split(all[0]);
    std::size_t i = 0;
    while (i < theirs.size() && i < first.size() && theirs[i] == first[i]) ++i;
    const std::string a = i < first.size() ? first[i] : "(nothing more)";
    const std::string b = i < theirs.size() ? theirs[i] : "(nothing more)";
    TORCH_CHECK(false, "cpprun::FullyShardedDataParallel: rank ", r, " wraps otherwise than rank 0: \"", b,
                "\" on rank ", r, ", \"", a, "\" on rank 0. Every rank must wrap the same model with the same "
                "FsdpOptions (stage, wrap policy, dtypes, offload).");
  }
}

}  // namespace

FsdpCore::FsdpCore(torch::nn::Module& module, ProcessGroup group, std::optional<DeviceMesh> mesh,
                   FsdpOptions options)
    : impl_(std::make_unique<Impl>(module, member_group("FullyShardedDataParallel", std::move(group)), mesh,
                                   std::move(options))) {
  Impl& s = *impl_;
  const int stage = s.options.stage();
  // Each rank's own checks, then an exchange that every rank reaches (Note [One FSDP configuration
  // on every rank]): a rank whose options fail them does not leave the others waiting.
  std::exception_ptr local_failure;
  std::vector<UnitPlan> units;
  try {
    TORCH_CHECK(!s.options.cpu_offload() || stage == 3, "cpprun::FullyShardedDataParallel: cpu_offload needs stage 3 "
                "(it offloads the parameter shards), got stage ", stage, ".");
    TORCH_CHECK(s.options.gathered_unit_limit() >= 1, "cpprun::FullyShardedDataParallel: gathered_unit_limit must be "
                "at least 1, got ", s.options.gathered_unit_limit(), ".");
    TORCH_CHECK(s.options.auto_wrap_min_params() >= 0, "cpprun::FullyShardedDataParallel: auto_wrap_min_params must "
                "not be negative, got ", s.options.auto_wrap_min_params(), ".");
    TORCH_CHECK(!s.options.output_dtype() || at::isFloatingType(*s.options.output_dtype()),
                "cpprun::FullyShardedDataParallel: output_dtype must be a floating-point dtype (it casts the "
                "floating-point outputs), got ", *s.options.output_dtype(), ".");
    TORCH_CHECK(!s.options.param_dtype() || at::isFloatingType(*s.options.param_dtype()),
                "cpprun::FullyShardedDataParallel: param_dtype must be a floating-point dtype (the module computes "
                "in it, e.g. at::kBFloat16), got ", *s.options.param_dtype(), ".");
    TORCH_CHECK(!s.options.reduce_dtype() || at::isFloatingType(*s.options.reduce_dtype()),
                "cpprun::FullyShardedDataParallel: reduce_dtype must be a floating-point dtype (the gradients are "
                "reduced in it, e.g. at::kFloat), got ", *s.options.reduce_dtype(), ".");

    refuse_tensor_parallel_overlap(s.tp_splits, s.groups.whole, "cpprun::FullyShardedDataParallel");
    refuse_wrapped_parameters(module, "cpprun::FullyShardedDataParallel", RefuseWrapped::kAny);
    units = plan_units(module, s.options);
  } catch (...) {
    local_failure = std::current_exception();
  }
  check_ranks_wrap_alike(s.group, local_failure ? std::vector<std::string>{} : describe_wrapping(units, s.options),
                         local_failure);
  s.unit_count = units.size();
  // Start from rank 0's parameters and buffers everywhere; a deferred module is materialised unit by
  // unit as it is sharded, each broadcast then.
  std::unique_ptr<DeferredUnits> deferred;
  if (has_deferred_state(module)) {
    deferred = std::make_unique<DeferredUnits>(module, units, s.group);
    deferred->materialize_rest();
  } else {
    broadcast_module_state(module, s.group);
  }
  ShardOptions sharding;
  sharding.rank = s.groups.shard.rank();
  sharding.world = s.groups.shard.size();
  sharding.compute_dtype = s.options.param_dtype();
  sharding.separate_shards = s.stage.shard_parameters;
  sharding.keep_unsharded = !s.stage.shard_parameters;
  sharding.shards_on_cpu = s.options.cpu_offload();
  if (deferred) sharding.before_unit = [&deferred](std::size_t u) { deferred->materialize_unit(u); };
  s.buckets = shard_units(units, sharding);
  if (!s.stage.shard_parameters) {
    for (const auto& bucket : s.buckets) s.shard_versions.push_back(Impl::shard_version_sum(bucket));
    s.compute_copies = std::make_unique<ComputeCopyVersions>(s.buckets);
  }
  for (const auto& bucket : s.buckets) {
    for (const auto& p : bucket.params()) s.shards.emplace_back(p.name, p.shard);
  }
  register_partial_gradients(s.shards);
  {
    std::vector<at::Tensor> taken;
    for (const auto& bucket : s.buckets) {
      for (const auto& p : bucket.params()) taken.insert(taken.end(), {p.param, p.shard});
    }
    s.wrapped = std::make_unique<WrappedParameters>("cpprun::FullyShardedDataParallel", taken);
  }
  s.trainable_buckets = trainable_bucket_count(s.buckets);
  for (std::size_t b = s.trainable_buckets; b < s.buckets.size(); ++b) {
    for (const auto& p : s.buckets[b].params()) s.frozen.push_back({p.name, p.param, p.shard});
  }
  std::size_t root_unit = units.size();  // the top-level module's own parameters, if it has any
  for (std::size_t u = 0; u < units.size(); ++u) {
    if (units[u].name.empty()) root_unit = u;
  }

  std::function<void(std::size_t)> bucket_done;
  if (s.stage.shard_parameters) {
    ResidencyOptions residency;
    residency.reshard_after_forward = s.options.reshard_after_forward();
    residency.prefetch = s.options.prefetch();
    residency.limit = s.options.gathered_unit_limit();
    s.residency = std::make_unique<ParameterResidency>(s.buckets, units.size(), root_unit, s.groups.shard, residency);
    // A pipeline stage's micro-batch backwards (local, under manual finalization) keep what they
    // gathered for the next micro-batch, as PyTorch's schedules set_reshard_after_backward(false)
    // for all but a stage's last backward; finalize_backward() then ends the step's backward.
    bucket_done = [impl = &s](std::size_t b) {
      if (!impl->manual_finalization) impl->residency->backward_done(b);
    };
  }
  GradientSyncOptions reduction;
  reduction.shard_gradients = s.stage.shard_gradients;
  // Unset: each parameter's own dtype, not param_dtype (FSDP2's default since PyTorch 2.15).
  reduction.reduce_dtype = s.options.reduce_dtype();
  // One reduction runs while the next unit's backward computes (none with a limit of 1): each
  // one more would hold another unit's full gradients (see gradient_sync.h).
  reduction.max_in_flight = s.options.gathered_unit_limit() > 1 ? 1 : 0;
  const std::span<ParamBucket> trainable(s.buckets.data(), s.trainable_buckets);
  reduction.reduction_order = reduction_order(trainable, units);
  s.sync = std::make_unique<GradientSync>(trainable, s.groups, reduction, std::move(bucket_done));
  if (s.residency) {
    s.sync->on_backward_end([impl = &s](bool reduced) {
      if (reduced || !impl->manual_finalization) impl->residency->end_backward(reduced);
    });
  }
}

FsdpCore::~FsdpCore() = default;

void FsdpCore::before_forward() {
  PublicCallScope call("FullyShardedDataParallel's forward");
  Impl& s = *impl_;
  refuse_moved_parameters(s.buckets);
  const bool grad = torch::autograd::GradMode::is_enabled();
  if (grad) refuse_unfrozen_parameters(s.frozen);
  if (s.residency) {
    // Within a pipeline step the shards are not stepped between micro-batches: what forward kept
    // gathered (reshard_after_forward(false)) is current, and stays until finalize_backward.
    if (s.manual_finalization && s.step_open && grad) s.residency->continue_forward();
    else s.residency->begin_forward(/*ends_window=*/grad);
  }
  if (s.manual_finalization && grad) s.step_open = true;
  // An evaluation forward (no autograd) may come between backward and the step: it gathers what
  // may be stale and leaves the window to the next training forward.
  s.gather_if_stepped(/*ends_window=*/grad);
  if (grad) s.sync->prepare(s.require_sync && !s.manual_finalization);
}

void FsdpCore::after_forward(const std::vector<at::Tensor>& /*outputs*/) {
  PublicCallScope call("FullyShardedDataParallel's forward");
  if (impl_->residency) impl_->residency->end_forward(torch::autograd::GradMode::is_enabled());
}

void FsdpCore::gather_full_parameters() {
  PublicCallScope call("FullyShardedDataParallel::gather_full_parameters");
  if (impl_->residency) impl_->residency->gather_all();
  impl_->gather_if_stepped(/*ends_window=*/false);
}

void FsdpCore::register_shards(torch::nn::Module& wrapper) const {
  std::unordered_map<const c10::TensorImpl*, at::Tensor> shard_of;
  for (const auto& bucket : impl_->buckets) {
    for (const auto& s : bucket.params()) shard_of[s.param.unsafeGetTensorImpl()] = s.shard;
  }
  // Module names may not contain dots: one plain module per path component, made on first need,
  // so that the wrapper's named_parameters() walk meets the names in the wrapped module's order.
  std::unordered_map<std::string, std::shared_ptr<torch::nn::Module>> made;
  // Each tensor once, under its first name, as Python's named_parameters() (and so FSDP2) lists
  // them: LibTorch's own repeats a tied weight under every name, and an optimizer built from such
  // a list steps it twice.
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const auto& item : impl_->module.named_parameters()) {
    const std::string& name = item.key();
    if (!seen.insert(item.value().unsafeGetTensorImpl()).second) continue;
    auto it = shard_of.find(item.value().unsafeGetTensorImpl());
    TORCH_INTERNAL_ASSERT(it != shard_of.end(), "FSDP parameter ", name, " is in no bucket");
    const at::Tensor& tensor = it->second;
    torch::nn::Module* owner = &wrapper;
    std::string path;
    std::size_t start = 0;
    for (std::size_t dot = name.find('.'); dot != std::string::npos; dot = name.find('.', start)) {
      const std::string part = name.substr(start, dot - start);
      path += (path.empty() ? "" : ".") + part;
      auto& child = made[path];
      if (!child) child = owner->register_module(part, std::make_shared<torch::nn::Module>("FsdpShards"));
      owner = child.get();
      start = dot + 1;
    }
    owner->register_parameter(name.substr(start), tensor, tensor.requires_grad());
  }
}

double FsdpCore::clip_grad_norm(double max_norm, double norm_type, bool error_if_nonfinite) {
  PublicCallScope call("FullyShardedDataParallel::clip_grad_norm");
  std::vector<GradientToClip> grads;
  for (std::size_t b = 0; b < impl_->trainable_buckets; ++b) {
    for (const auto& s : impl_->buckets[b].params()) {
      const auto split = impl_->tp_splits.find(s.name);
      grads.push_back({s.shard.grad(), split == impl_->tp_splits.end() ? std::nullopt
                                                                       : std::optional<ProcessGroup>(split->second.group)});
    }
  }
  // The shard group's shards cover every gradient exactly once (HSDP: replicas hold equal ones).
  return detail::clip_grad_norm(grads, {max_norm, norm_type, error_if_nonfinite}, &impl_->groups.shard,
                               "cpprun::FullyShardedDataParallel");
}

at::Tensor FsdpCore::cast_input(const at::Tensor& input) const {
  const auto& dtype = impl_->options.param_dtype();
  if (!impl_->options.cast_forward_inputs()) return input;
  if (!dtype || !input.defined() || !input.is_floating_point() || input.scalar_type() == *dtype) return input;
  return input.to(*dtype);
}

at::Tensor FsdpCore::cast_output(const at::Tensor& output) const {
  const auto& dtype = impl_->options.output_dtype();
  if (!dtype || !output.defined() || !output.is_floating_point() || output.scalar_type() == *dtype) return output;
  return output.to(*dtype);
}

FsdpMemory FsdpCore::memory() const {
  const Impl& s = *impl_;
  FsdpMemory m;
  for (const auto& bucket : s.buckets) {
    m.parameters += static_cast<int64_t>(bucket.unsharded().storage().nbytes());
    if (!bucket.shards_are_separate()) continue;
    for (const auto& p : bucket.params()) m.shards += static_cast<int64_t>(p.shard.nbytes());
  }
  m.peak_parameters = s.residency ? s.residency->peak_gathered_bytes() : m.parameters;
  m.gradients = s.sync->gradient_bytes();
  m.peak_gradients = s.sync->peak_gradient_bytes();
  m.kept = s.residency ? s.residency->kept_bytes() : 0;
  return m;
}

std::size_t FsdpCore::unit_count() const { return impl_->unit_count; }
std::size_t FsdpCore::bucket_count() const { return impl_->buckets.size(); }

FsdpPrefetchStats FsdpCore::prefetch_stats() const {
  FsdpPrefetchStats stats;
  if (impl_->residency) impl_->residency->prefetch_stats(stats.started, stats.used);
  return stats;
}

// Each parameter's entry is its shard, the tensor the optimizer steps: under mixed precision the
// fp32 master, not the compute copy (as PyTorch's FSDP2, whose state_dict() holds the sharded fp32
// parameters), frozen ones included. Buffers are the module's own, replicated.
void FsdpCore::describe_state(StateView& view) {
  Impl& s = *impl_;
  if (s.compute_copies) s.compute_copies->refuse_writes(s.buckets, s.groups.shard.rank());
  view = module_state_view(s.module, s.tp_splits, s.groups.whole);
  std::unordered_map<const c10::TensorImpl*, StateEntry*> entry_of;
  for (auto& entry : view.entries) entry_of[entry.module_tensor.unsafeGetTensorImpl()] = &entry;
  for (const ParamBucket& bucket : s.buckets) {
    for (const ShardedParam& p : bucket.params()) {
      const auto found = entry_of.find(p.param.unsafeGetTensorImpl());
      TORCH_INTERNAL_ASSERT(found != entry_of.end(), "FSDP parameter ", p.name, " is not in the module's state");
      StateEntry& entry = *found->second;
      entry.local = p.shard;
      entry.device = p.param.device();  // an offloaded shard lives on the CPU; collectives want this
      entry.placement.rows = RowShard{s.groups.shard, p.rows,       p.row_numel, p.rows_per_rank,
                                      p.first_row,    p.local_rows, p.sizes,     p.shard_sizes()};
    }
  }
  // A load wrote the shards: the full parameters follow at once (ZeRO-1/2), or when next used
  // (ZeRO-3 gathers again: Note [Stale gathered units] in parameter_residency.cpp).
  view.after_load = [&s] {
    if (s.residency) s.residency->shards_replaced();
    s.shards_loaded = true;
    s.gather_if_stepped(/*ends_window=*/false);
  };
}

// The one setting behind no_sync() and set_requires_gradient_sync(): what the next forward
// prepares, and what a backward prepared but not started does (FSDP2 reads it in backward).
void FsdpCore::set_require_sync(bool sync) {
  impl_->require_sync = sync;
  impl_->sync->set_sync(sync && !impl_->manual_finalization);
}

void FsdpCore::set_requires_all_reduce(bool all_reduce) { impl_->sync->set_all_reduce(all_reduce); }
bool FsdpCore::requires_all_reduce() const { return impl_->sync->all_reduce_enabled(); }

void FsdpCore::unshard() { gather_full_parameters(); }

void FsdpCore::reshard() {
  PublicCallScope call("FullyShardedDataParallel::reshard");
  if (impl_->residency) impl_->residency->release_all();
}

// Stages 1 and 2 keep the full parameters by definition: "off" is what they do; "on" would need
// stage 3, and is refused rather than ignored.
void FsdpCore::set_reshard_after_forward(bool on) {
  TORCH_CHECK(!on || impl_->options.stage() == 3, "cpprun::FullyShardedDataParallel::set_reshard_after_forward(true): "
              "stage ", impl_->options.stage(), " keeps the full parameters between steps (that is what ZeRO stages 1 "
              "and 2 are), so there is nothing to release after forward; use FsdpOptions().stage(3) to shard them.");
  impl_->options.reshard_after_forward(on);
  if (impl_->residency) impl_->residency->set_reshard_after_forward(on);
}

void FsdpCore::set_reshard_after_backward(bool on) {
  TORCH_CHECK(!on || impl_->options.stage() == 3, "cpprun::FullyShardedDataParallel::set_reshard_after_backward(true): "
              "stage ", impl_->options.stage(), " keeps the full parameters between steps (that is what ZeRO stages 1 "
              "and 2 are), so there is nothing to release after backward; use FsdpOptions().stage(3) to shard them.");
  if (impl_->residency) impl_->residency->set_reshard_after_backward(on);
}
void FsdpCore::set_gradient_divide_factor(double factor) {
  TORCH_CHECK(std::isfinite(factor) && factor > 0, "cpprun::FullyShardedDataParallel::set_gradient_divide_factor: the "
              "factor divides the sum of the ranks' gradients, so it must be a positive finite number, got ", factor,
              " (the default, an average, is the data-parallel size: ", impl_->groups.whole.size(), " here).");
  impl_->sync->set_gradient_divide_factor(factor);
}
void FsdpCore::set_force_sum_reduction_for_comms(bool enable) { impl_->sync->set_force_sum_reduction(enable); }
void FsdpCore::set_all_reduce_hook(std::function<void(const at::Tensor&)> hook) {
  impl_->sync->set_all_reduce_hook(std::move(hook));
}
void FsdpCore::set_manual_finalization(bool on) { impl_->manual_finalization = on; }
void FsdpCore::finalize_backward() {
  PublicCallScope call("FullyShardedDataParallel::finalize_backward");
  TORCH_CHECK(impl_->manual_finalization, "cpprun::FullyShardedDataParallel::finalize_backward: manual finalization "
              "is off; backward reduces the gradients itself.");
  impl_->sync->finalize();  // ZeRO-3: its end releases every unit
  impl_->step_open = false;
}
const ProcessGroup* FsdpCore::shard_group() const { return &impl_->groups.shard; }
bool FsdpCore::require_sync() const { return impl_->require_sync; }
const ProcessGroup& FsdpCore::group() const { return impl_->group; }
const FsdpOptions& FsdpCore::options() const { return impl_->options; }

}  // namespace cpprun::detail
