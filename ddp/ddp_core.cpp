// DistributedDataParallel's non-template part: construction checks, buffer broadcast, the
// steps around forward, and join for uneven inputs.
#include "cpprun/detail/ddp_core.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <sstream>
#include <unordered_set>

#include "comm/group_membership.h"
#include "comm/public_call.h"
#include "core/clip_grad_norm.h"
#include "checkpoint/state_view.h"
#include "core/tensor_parallel_splits.h"
#include "core/wrapped_parameters.h"
#include "cpprun/collectives.h"
#include "ddp/reducer.h"

namespace cpprun::detail {
namespace {

// What each rank says about itself at each step of a join (see DdpCore::join).
enum class JoinState : int64_t { kJoined = 0, kActiveNoSync = 1, kActiveSync = 2 };

std::string shape_string(const std::vector<int64_t>& desc, std::size_t at, int64_t ndim) {
  std::ostringstream out;
  out << "[";
  for (int64_t d = 0; d < ndim; ++d) out << (d ? ", " : "") << desc[at + d];
  out << "]";
  return out.str();
}

// Every rank must wrap the same model: compare each rank's parameter count, dtypes and shapes
// with rank 0's, and name the first difference. Every rank reaches the same verdict.
void verify_same_parameters(const ProcessGroup& group, const std::vector<std::string>& names,
                            const std::vector<at::Tensor>& params) {
  std::vector<int64_t> desc{static_cast<int64_t>(params.size())};
  for (const auto& p : params) {
    desc.push_back(static_cast<int64_t>(p.scalar_type()));
    desc.push_back(p.dim());
    desc.insert(desc.end(), p.sizes().begin(), p.sizes().end());
  }
  const int n = group.size();
  auto length = at::tensor({static_cast<int64_t>(desc.size())}, at::kLong);
  auto lengths = at::empty({n}, at::kLong);
  all_gather_into(group, lengths, length);
  const int64_t longest = lengths.max().item<int64_t>();
  desc.resize(longest, -1);
  auto all = at::empty({n * longest}, at::kLong);
  all_gather_into(group, all, at::tensor(desc, at::kLong));
  const int64_t* data = all.data_ptr<int64_t>();
  const std::vector<int64_t> rank0(data, data + longest);

  for (int r = 1; r < n; ++r) {
    const std::vector<int64_t> other(data + r * longest, data + (r + 1) * longest);
    TORCH_CHECK(other[0] == rank0[0], "cpprun::DistributedDataParallel: rank ", r, " has ", other[0],
                " parameters that require grad but rank 0 has ", rank0[0],
                ". Every rank must construct the same model.");
    std::size_t at = 1;
    for (int64_t i = 0; i < rank0[0]; ++i) {
      const int64_t ndim0 = rank0[at + 1], ndim = other[at + 1];
      const bool same = rank0[at] == other[at] && ndim0 == ndim &&
                        std::equal(rank0.begin() + at + 2, rank0.begin() + at + 2 + ndim0, other.begin() + at + 2);
      // Only shapes and dtypes are exchanged: the name is this rank's (the ranks may be freezing
      // different parameters, so that parameter i is another one on each).
      TORCH_CHECK(same, "cpprun::DistributedDataParallel: the ranks' parameters that require grad differ at ",
                  "parameter ", i, ": shape ", shape_string(other, at + 2, ndim), " and dtype ",
                  static_cast<c10::ScalarType>(other[at]), " on rank ", r, ", shape ",
                  shape_string(rank0, at + 2, ndim0), " and dtype ", static_cast<c10::ScalarType>(rank0[at]),
                  " on rank 0 (on this rank, rank ", group.rank(), ", it is \"", names[i], "\"). Every rank must ",
                  "construct the same model, and freeze the same parameters.");
      at += 2 + ndim0;
    }
  }
}

}  // namespace

struct DdpCore::Impl {
  torch::nn::Module& module;
  ProcessGroup group;
  DdpOptions options;
  std::vector<at::Tensor> buffers;
  std::unique_ptr<Reducer> reducer;
  bool require_sync = true;
  bool manual_finalization = false;  // a pipeline stage: finalize_backward() reduces, once a step
  bool joining = false;  // inside join(): each forward first tells the others this rank is active
  // PyTorch's require_forward_param_sync: whether the next forward broadcasts the buffers. True at
  // first, then whether the last forward was one whose backward reduces (grad mode on, outside
  // no_sync). So evaluation under NoGradGuard syncs once, at its first forward, and ranks may then
  // run different numbers of eval batches (each forward's broadcast once made that hang).
  bool sync_buffers_next = true;
  // Parameters split by tensor parallelism, by name (cpprun/tensor_parallel_split.h).
  std::map<std::string, TensorParallelSplit> tp_splits;
  // Its parameters, noted while it lives (Note [One data-parallel wrapper per parameter]).
  std::unique_ptr<WrappedParameters> wrapped;

  Impl(torch::nn::Module& m, ProcessGroup g, DdpOptions o)
      : module(m), group(std::move(g)), options(o), tp_splits(tensor_parallel_splits(m)) {}

  // Join's handshake: every rank's JoinState, gathered. Returns the highest active rank (the
  // source of buffers this step, as PyTorch's _find_common_rank picks it), -1 when every rank has
  // joined, and whether any active rank will reduce gradients.
  std::pair<int, bool> exchange_join_state(JoinState mine) {
    auto state = at::tensor({static_cast<int64_t>(mine)}, at::kLong);
    auto states = at::empty({group.size()}, at::kLong);
    all_gather_into(group, states, state);
    int source = -1;
    bool any_sync = false;
    for (int r = 0; r < group.size(); ++r) {
      const auto s = static_cast<JoinState>(states[r].item<int64_t>());
      if (s != JoinState::kJoined) source = r;
      any_sync = any_sync || s == JoinState::kActiveSync;
    }
    if (source >= 0) last_active = source;
    return {source, any_sync};
  }
  int last_active = -1;  // the highest rank active at the last handshake any rank was active in

  void broadcast_buffers(int source) {
    if (options.syncs_buffers_before_forward() && !buffers.empty()) broadcast_coalesced(group, buffers, source);
  }
};

DdpCore::DdpCore(torch::nn::Module& module, ProcessGroup group, DdpOptions options)
    : impl_(std::make_unique<Impl>(module, member_group("DistributedDataParallel", std::move(group)), options)) {
  PublicCallScope call("DistributedDataParallel's constructor");
  TORCH_CHECK(options.bucket_cap_mb() > 0 && options.first_bucket_cap_mb() > 0,
              "cpprun::DistributedDataParallel: bucket_cap_mb and first_bucket_cap_mb must be positive, got ",
              options.bucket_cap_mb(), " and ", options.first_bucket_cap_mb(), ".");
  refuse_tensor_parallel_overlap(impl_->tp_splits, impl_->group, "cpprun::DistributedDataParallel");
  std::vector<std::string> names;
  std::vector<at::Tensor> params;
  // A tensor registered under several names (tied weights) is one parameter: reduced once.
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    if (item.value().requires_grad() && seen.insert(item.value().unsafeGetTensorImpl()).second) {
      names.push_back(item.key()), params.push_back(item.value());
    }
  }
  TORCH_CHECK(!params.empty(), "cpprun::DistributedDataParallel: the module has no parameter that requires "
              "grad; there is nothing to synchronize.");
  refuse_wrapped_parameters(module, "cpprun::DistributedDataParallel", RefuseWrapped::kSharded);
  for (const auto& buffer : module.buffers(/*recurse=*/true)) impl_->buffers.push_back(buffer);

  if (options.init_sync() && impl_->group.size() > 1) {
    verify_same_parameters(impl_->group, names, params);
    std::vector<at::Tensor> state = params;
    // broadcast_buffers(false) keeps each rank's buffers from the start too, as PyTorch's
    // broadcast_buffers=False leaves them out of its construction sync (forward_sync_buffers does not).
    if (options.syncs_buffers_at_construction()) {
      state.insert(state.end(), impl_->buffers.begin(), impl_->buffers.end());
    }
    broadcast_coalesced(impl_->group, state, 0);
  }
  impl_->wrapped = std::make_unique<WrappedParameters>("cpprun::DistributedDataParallel", params);
  impl_->reducer = std::make_unique<Reducer>(std::move(names), std::move(params), impl_->group, options);
}

DdpCore::~DdpCore() = default;

void DdpCore::before_forward() {
  PublicCallScope call("DistributedDataParallel's forward");
  Impl& s = *impl_;
  const bool will_sync = s.require_sync && !s.manual_finalization && torch::autograd::GradMode::is_enabled();
  // A pipeline stage's forwards (manual finalization) reduce at the step's end: they count too.
  s.reducer->check_previous_backward(will_sync || (s.manual_finalization && torch::autograd::GradMode::is_enabled()));
  if (torch::autograd::GradMode::is_enabled()) s.reducer->check_parameters_as_wrapped();
  int buffer_source = 0;
  if (s.joining) {
    buffer_source = s.exchange_join_state(will_sync ? JoinState::kActiveSync : JoinState::kActiveNoSync).first;
  }
  if (will_sync) s.reducer->rebuild_buckets_if_due();
  if (s.group.size() > 1 && s.sync_buffers_next) s.broadcast_buffers(buffer_source);
  s.sync_buffers_next = s.require_sync && torch::autograd::GradMode::is_enabled();
}

void DdpCore::after_forward(const std::vector<at::Tensor>& outputs) {
  PublicCallScope call("DistributedDataParallel's forward");
  if (impl_->require_sync && !impl_->manual_finalization && torch::autograd::GradMode::is_enabled()) {
    impl_->reducer->prepare_for_backward(outputs);
  }
}

// Note [Join for uneven inputs]
// Inside join(), each forward starts with an all-gather of every rank's JoinState. A rank whose
// loop has ended keeps answering that all-gather with kJoined and mirrors, step by step, the
// collectives an active rank makes: the bucket rebuild, the buffer broadcast (from the highest
// active rank, when due) and, when an active rank reduces gradients, one reduction per bucket with zeros
// plus the used-parameter flags. When the all-gather says every rank has joined, every rank takes
// the parameters (and buffers) of the last rank to join, as PyTorch's join post-hook, and all return.
// Averages still divide by the full world size, as PyTorch's default.
void DdpCore::join(const std::function<void()>& train_loop) {
  Impl& s = *impl_;
  TORCH_CHECK(!s.joining, "cpprun::DistributedDataParallel::join: already inside join().");
  TORCH_CHECK(!s.manual_finalization, "cpprun::DistributedDataParallel::join: a pipeline stage's DDP (manual "
              "finalization) cannot run inside join(); give every pipeline the same number of steps.");
  s.joining = true;
  s.last_active = -1;
  try {
    train_loop();
    PublicCallScope call("DistributedDataParallel::join (a joined rank)");
    for (;;) {
      const auto [source, any_sync] = s.exchange_join_state(JoinState::kJoined);
      if (source < 0) break;
      if (any_sync) s.reducer->rebuild_buckets_if_due();
      if (s.sync_buffers_next) s.broadcast_buffers(source);
      s.sync_buffers_next = any_sync;  // as the active ranks' own forwards set theirs
      if (any_sync) s.reducer->reduce_as_joined_rank();
    }
    // As PyTorch's join post-hook (_sync_final_model): the ranks that ran out early skipped the
    // last steps, so every rank takes the parameters (and buffers) of the last rank to join.
    if (s.group.size() > 1 && s.last_active >= 0) {
      std::vector<at::Tensor> state = s.module.parameters(/*recurse=*/true);
      if (s.options.syncs_buffers_before_forward()) state.insert(state.end(), s.buffers.begin(), s.buffers.end());
      broadcast_coalesced(s.group, state, s.last_active);
    }
  } catch (...) {
    s.joining = false;
    throw;
  }
  s.joining = false;
}

void DdpCore::set_require_sync(bool sync) { impl_->require_sync = sync; }
void DdpCore::set_manual_finalization(bool on) {
  TORCH_CHECK(!impl_->joining, "cpprun::DistributedDataParallel: a pipeline stage cannot run inside join().");
  impl_->manual_finalization = on;
}
void DdpCore::begin_last_backward() {
  TORCH_CHECK(impl_->manual_finalization, "cpprun::DistributedDataParallel::begin_last_backward: manual ",
              "finalization is off; backward reduces the gradients itself.");
  if (torch::autograd::GradMode::is_enabled()) impl_->reducer->prepare_for_last_backward();
}
void DdpCore::finalize_backward() {
  PublicCallScope call("DistributedDataParallel::finalize_backward");
  TORCH_CHECK(impl_->manual_finalization, "cpprun::DistributedDataParallel::finalize_backward: manual finalization "
              "is off; backward reduces the gradients itself.");
  impl_->reducer->reduce_accumulated();
}
bool DdpCore::require_sync() const { return impl_->require_sync; }
double DdpCore::clip_grad_norm(double max_norm, double norm_type, bool error_if_nonfinite) {
  PublicCallScope call("DistributedDataParallel::clip_grad_norm");
  // Each tensor once (a tied weight counted twice would inflate the norm and be scaled twice).
  return detail::clip_grad_norm(module_gradients(impl_->module, impl_->tp_splits),
                                {max_norm, norm_type, error_if_nonfinite}, /*sum_over=*/nullptr,
                                "cpprun::DistributedDataParallel");
}
void DdpCore::describe_state(StateView& view) {
  // Every rank holds the whole module (its tensor-parallel shards aside): replicated over the group.
  view = module_state_view(impl_->module, impl_->tp_splits, impl_->group);
}
void DdpCore::register_comm_hook(std::shared_ptr<CommHook> hook) { impl_->reducer->set_comm_hook(std::move(hook)); }
const ProcessGroup& DdpCore::group() const { return impl_->group; }
const DdpOptions& DdpCore::options() const { return impl_->options; }

}  // namespace cpprun::detail
