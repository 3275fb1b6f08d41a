// See reducer.h. Notes on the ordering rules every rank must follow are inline.
#include "ddp/reducer.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/engine.h>

#include <algorithm>
#include <numeric>
#include <unordered_set>
#include <utility>

#include "comm/public_call.h"
#include "core/tensor_alias.h"
#include "cpprun/collectives.h"
#include "ddp/bucket_assignment.h"

namespace cpprun::detail {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;
// What the bucket all-reduces are named in a mismatch (Note [The public call of a collective]).
constexpr const char* kDdpBackward = "DistributedDataParallel's backward";

// Whether `grad` is exactly this slot of a bucket (gradient_as_bucket_view), not merely another
// view of the same buffer or a view of a buffer from before a rebuild.
bool is_slot(const at::Tensor& grad, const at::Tensor& slot) {
  return grad.defined() && grad.is_alias_of(slot) && grad.data_ptr() == slot.data_ptr();
}

}  // namespace

Reducer::Reducer(std::vector<std::string> names, std::vector<at::Tensor> params, ProcessGroup group,
                 DdpOptions options)
    : names_(std::move(names)),
      params_(std::move(params)),
      group_(std::move(group)),
      options_(options) {
  average_scale_ = at::scalar_tensor(1.0 / group_.size(), at::kDouble);
  average_scale_.unsafeGetTensorImpl()->set_wrapped_number(true);
  for (const auto& p : params_) {
    TORCH_CHECK(!p.is_sparse(), "cpprun::DistributedDataParallel does not support sparse parameters.");
    wrapped_as_.push_back(p.options());
  }
  // Gradients arrive roughly in reverse registration order: bucket in that order until the
  // first backward tells the real one.
  std::vector<std::size_t> order(params_.size());
  std::iota(order.rbegin(), order.rend(), 0);
  build_buckets(order);

  for (std::size_t i = 0; i < params_.size(); ++i) {
    hooks_.add(params_[i], [this, i] {
      PublicCallScope call(kDdpBackward);
      on_gradient_ready(i);
    });
  }
}

Reducer::~Reducer() = default;

void Reducer::set_comm_hook(std::shared_ptr<CommHook> hook) {
  TORCH_CHECK(hook != nullptr, "cpprun::DistributedDataParallel::register_comm_hook: the hook is null.");
  TORCH_CHECK(synced_backwards_ == 0, "cpprun::DistributedDataParallel::register_comm_hook: register "
              "the hook before the first backward pass (it must be the same on every rank from the start).");
  hook_ = std::move(hook);
  allocate_buffers();  // alone, none were made before a hook needed them
}

// Note [Nothing to reduce alone]: a bucket that never holds a gradient takes no memory (at GPT-2
// 124M's size, 475 MiB of a GPU's memory beside the gradients themselves).
void Reducer::allocate_buffers() {
  if (leaves_gradients()) return;
  for (auto& bucket : buckets_) {
    if (!bucket.buffer.defined()) {
      bucket.buffer = at::zeros({bucket.numel}, params_[bucket.params.front()].options().requires_grad(false));
    }
  }
}

void Reducer::build_buckets(const std::vector<std::size_t>& order) {
  std::vector<BucketParam> ordered;
  for (std::size_t i : order) {
    const auto& p = params_[i];
    ordered.push_back({i, static_cast<int64_t>(p.numel() * p.element_size()), p.scalar_type(), p.device()});
  }
  const auto assignment = assign_buckets(ordered, static_cast<int64_t>(options_.first_bucket_cap_mb() * kMiB),
                                         static_cast<int64_t>(options_.bucket_cap_mb() * kMiB));
  buckets_.clear();
  location_.assign(params_.size(), {0, 0});
  for (const auto& indices : assignment) {
    Bucket bucket;
    for (std::size_t i : indices) {
      location_[i] = {buckets_.size(), bucket.params.size()};
      bucket.params.push_back(i);
      bucket.offsets.push_back(bucket.numel);
      bucket.numel += params_[i].numel();
    }
    buckets_.push_back(std::move(bucket));
  }
  allocate_buffers();
}

// A parameter's place in its bucket, contiguous; not a view, since gradient_as_bucket_view makes
// .grad this tensor (see core/tensor_alias.h).
at::Tensor Reducer::slot(std::size_t param) const {
  const auto [b, s] = location_[param];
  return alias_into(buckets_[b].buffer, buckets_[b].offsets[s], params_[param].sizes());
}

std::vector<std::vector<std::size_t>> Reducer::bucket_parameters() const {
  std::vector<std::vector<std::size_t>> out;
  for (const auto& bucket : buckets_) out.push_back(bucket.params);
  return out;
}

int64_t Reducer::bucket_bytes() const {
  int64_t bytes = 0;
  for (const auto& bucket : buckets_) bytes += bucket.buffer.defined() ? static_cast<int64_t>(bucket.buffer.nbytes()) : 0;
  return bytes;
}

bool Reducer::detects_unused() const {
  return options_.find_unused_parameters() || (options_.static_graph() && !static_unused_);
}

// Note [A forward that reduces nothing leaves the reducer alone]
// A forward under no grad or no_sync between a training forward and its backward (a metric, a
// teacher's or a target's output from the same model) used to reset the reducer: the backward that
// followed found it idle and reduced nothing, and the ranks trained apart without a word (an audit,
// 2026-12-07). PyTorch's DDP touches its reducer only in a forward that will reduce (_pre_forward:
// grad enabled and require_backward_grad_sync), and so does this: such a forward neither reports
// an unfinished backward nor forgets the one prepared.
void Reducer::check_previous_backward(bool will_reduce) {
  if (!will_reduce) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (state_ == BackwardState::kUnfinished) {
    const std::string missing = unready_parameter_list();
    state_ = BackwardState::kIdle;
    TORCH_CHECK(false, "cpprun::DistributedDataParallel: rank ", group_.rank(),
                ": the previous backward pass ended before every parameter received a gradient, so "
                "its gradient reduction never finished. This means some parameters took no part in "
                "computing the loss. Make every parameter contribute to the loss, or pass "
                "DdpOptions().find_unused_parameters(true) (or .static_graph(true) when the same "
                "parameters go unused in every iteration). Parameters that received no gradient on "
                "rank ", group_.rank(), ": ", missing);
  }
  // A forward with no backward after it (e.g. an evaluation under grad mode) is not an error.
  state_ = BackwardState::kIdle;
}

void Reducer::check_parameters_as_wrapped() const {
  // Note [A module converted after wrapping]
  // module->to(dtype or device) after wrapping gives each parameter new data of another type
  // (set_data), and autograd then drops the gradient accumulator the reducer's hooks are on: no
  // hook fires, no gradient is averaged, and each replica trains on its own gradients. PyTorch's
  // DDP does the same without a word; cpprun refuses at the next training forward (an evaluation
  // under no grad mode computes as the converted module does, as PyTorch's).
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const at::Tensor& p = params_[i];
    if (p.scalar_type() == wrapped_as_[i].dtype().toScalarType() && p.device() == wrapped_as_[i].device()) continue;
    TORCH_CHECK(false, "cpprun::DistributedDataParallel: the parameter \"", names_[i], "\" is ", p.scalar_type(),
                " on ", p.device(), " but was ", wrapped_as_[i].dtype().toScalarType(), " on ", wrapped_as_[i].device(),
                " when it was wrapped: the module was converted or moved after wrapping (module->to(...)), which "
                "drops the gradient hooks DDP averages through, so each rank would train on its own gradients. "
                "Call to() before wrapping it; to compute in another dtype, use autocast.");
  }
  // The same loss by another way: Tensor::set_ (what torch::load(module, file) writes parameters
  // with) gives the parameter a new gradient accumulator, with no hook on it (an audit,
  // 2026-12-07: the replicas trained apart without a word; PyTorch's DDP is as silent, but Python
  // loads by load_state_dict, which copies).
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const auto now = torch::autograd::impl::try_get_grad_accumulator(params_[i]);
    if (now.get() == hooks_.accumulator(i)) continue;
    TORCH_CHECK(false, "cpprun::DistributedDataParallel: the parameter \"", names_[i], "\" was replaced after "
                "wrapping (Tensor::set_, as torch::load(module, file) writes parameters, or a new tensor set in "
                "its place), which drops the gradient hooks DDP averages through, so each rank would train on its "
                "own gradients. Load before wrapping, or load into the wrapped model with cpprun::load_state_dict "
                "(which copies into the parameters), or copy_ under torch::NoGradGuard.");
  }
}

std::string Reducer::unready_parameter_list() const {
  std::string names, indices;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (ready_[i]) continue;
    names += (names.empty() ? "" : ", ") + names_[i];
    indices += (indices.empty() ? "" : " ") + std::to_string(i);
  }
  return names + " (indices " + indices + ")";
}

// Note [Bucket rebuild after the first backward]
// Buckets are first filled in reverse registration order, a guess at the order in which
// gradients become ready. The first synchronized backward records the real order; before the
// next forward, rank 0's order is broadcast and every rank re-buckets by it, so buckets fill
// front to back and each can be reduced as soon as it fills. All ranks must use the same
// buckets, hence rank 0's order and not each rank's own. Not done with find_unused_parameters,
// where the order may change between iterations.
void Reducer::rebuild_buckets_if_due() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (buckets_rebuilt_ || synced_backwards_ == 0 || options_.find_unused_parameters()) return;
  buckets_rebuilt_ = true;
  std::vector<int64_t> order;
  std::vector<bool> listed(params_.size(), false);
  for (std::size_t i : ready_order_) order.push_back(static_cast<int64_t>(i)), listed[i] = true;
  for (std::size_t i = params_.size(); i-- > 0;) {  // never-ready parameters go last
    if (!listed[i]) order.push_back(static_cast<int64_t>(i));
  }
  auto rank0_order = at::tensor(order, at::kLong);
  broadcast(group_, rank0_order, 0);
  const int64_t* data = rank0_order.data_ptr<int64_t>();
  build_buckets(std::vector<std::size_t>(data, data + rank0_order.numel()));
}

// Note [Same reduction order on every rank]
// Collectives are matched by the order in which ranks issue them, but gradients may become
// ready in different orders on different ranks. So bucket k is reduced only after buckets
// 0..k-1 were launched (launch_ready_buckets), and the used-parameter flags after all buckets.
void Reducer::expect_gradients() {
  state_ = BackwardState::kExpecting;
  ready_.assign(params_.size(), false);
  used_here_.assign(params_.size(), false);
  next_bucket_ = 0;
  finish_queued_ = false;
  manual_end_ = false;
  unused_waiting_.clear();
  for (auto& bucket : buckets_) bucket.pending = bucket.params.size(), bucket.work = Work();
}

// Note [Unused parameters join at the backward's start]
// The forward finds the parameters that will get no gradient, but they are marked ready (their
// .grad, or zeros, copied into their buckets) at the backward's first gradient, as PyTorch's
// reducer does (has_marked_unused_parameters_): a .grad they hold then is what goes into the
// average, and a zero_grad() between the forward and the backward, as many loops have it, clears
// the last step's first. Marked at the forward, a used-elsewhere parameter sent its .grad of the
// step before (and, as a bucket's slot, had it scaled in place).
void Reducer::prepare_for_backward(const std::vector<at::Tensor>& outputs) {
  std::lock_guard<std::mutex> lock(mutex_);
  expect_gradients();

  if (static_unused_) {  // static_graph: the first backward told which parameters are unused
    for (std::size_t i = 0; i < params_.size(); ++i) {
      if (static_unused_->here[i]) unused_waiting_.push_back(i);
    }
  } else if (detects_unused() && !outputs.empty()) {
    // Walk the autograd graph from the outputs: parameters whose accumulator is not reached will
    // get no gradient; marked ready at the backward's start, their buckets need not wait for its end.
    std::unordered_set<torch::autograd::Node*> seen;
    std::vector<torch::autograd::Node*> stack;
    for (const auto& out : outputs) {
      if (out.defined() && out.grad_fn()) stack.push_back(out.grad_fn().get());
    }
    while (!stack.empty()) {
      auto* node = stack.back();
      stack.pop_back();
      if (!seen.insert(node).second) continue;
      for (const auto& edge : node->next_edges()) {
        if (edge.function) stack.push_back(edge.function.get());
      }
    }
    for (std::size_t i = 0; i < params_.size(); ++i) {
      if (!seen.count(hooks_.accumulator(i))) unused_waiting_.push_back(i);
    }
  }
}

// Note [A pipeline stage's last backward]
// A pipeline stage's micro-batches accumulate their gradients locally, and one reduction a step
// follows (manual finalization). Armed before the stage's last backward of the step, the hooks
// reduce each bucket as soon as its gradients (by then the sums over the step's micro-batches)
// are ready, as a synchronized backward's do, and the pipeline's remaining passes and messages
// overlap the buckets' reductions (PyTorch's pipelining likewise prepares DDP's reducer before
// the last micro-batch's backward). Unused parameters are not looked for then: a parameter the
// last micro-batch did not reach may hold an earlier one's gradient, so reduce_accumulated()
// marks the rest by whether they hold one. No engine callback ends it: the stage's last
// backward may be one of several autograd calls, and the schedule knows when the step is over.
void Reducer::prepare_for_last_backward() {
  std::lock_guard<std::mutex> lock(mutex_);
  expect_gradients();
  manual_end_ = true;
}

void Reducer::on_gradient_ready(std::size_t param) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (state_ != BackwardState::kExpecting) return;  // no_sync, eval, or a backward we did not prepare
  if (!finish_queued_ && !manual_end_) {
    finish_queued_ = true;
    torch::autograd::Engine::get_default_engine().queue_callback([this] {
      PublicCallScope call(kDdpBackward);
      finish_backward();
    });
  }
  for (const std::size_t unused : std::exchange(unused_waiting_, {})) mark_ready(unused, /*used=*/false);
  TORCH_CHECK(!ready_[param], "cpprun::DistributedDataParallel: parameter ", names_[param],
              " received a gradient twice in one backward pass (after being found unused, or by "
              "a second backward through the same forward). Run forward again before each backward.");
  if (synced_backwards_ == 0) ready_order_.push_back(param);
  mark_ready(param, /*used=*/true);
  launch_ready_buckets();
}

// Note [Nothing to reduce alone]
// With one rank and the built-in all-reduce (no comm hook), the average of the gradients over the
// group is each gradient itself: copying it into its bucket scaled by 1/1, all-reducing nothing
// and copying it back would only cost two passes over every gradient and two operations per
// parameter (on a GPU, about 300 kernel launches a step at GPT-2 124M's 148 tensors). So the
// gradients stay where autograd put them, and the buckets are left alone; the bookkeeping (which
// parameters got a gradient, the unfinished-backward error, no_sync, static_graph) is the same.
// PyTorch's DDP copies at one rank too. The buckets' buffers are not even allocated (the
// memory of every gradient again), and gradient_as_bucket_view has no buckets to view: .grad is
// autograd's own tensor, the memory it was meant to save never being spent. A comm hook
// still runs (it may compress, or count), on the buckets, as at any size.
void Reducer::mark_ready(std::size_t param, bool used) {
  if (!leaves_gradients()) copy_into_bucket(param);  // Note [Nothing to reduce alone]
  ready_[param] = true;
  used_here_[param] = used;
  --buckets_[location_[param].first].pending;
}

void Reducer::copy_into_bucket(std::size_t param) {
  // The bucket holds values, never part of a graph: under backward(create_graph=true) gradients
  // require grad, and out= ops such as mul_out would refuse them.
  at::NoGradGuard no_grad;
  at::Tensor view = slot(param);
  at::Tensor& grad = params_[param].mutable_grad();
  const bool scale = hook_ == nullptr;
  // A parameter this backward did not use still sends the .grad it has (accumulated under
  // no_sync, or left by a backward without zero_grad), as PyTorch's reducer does: zeros would
  // drop it from the average every rank then holds. Zeros only where there is no .grad.
  if (!grad.defined()) {
    view.zero_();
  } else if (is_slot(grad, view)) {
    if (scale) view.mul_(average_scale_);
  } else if (scale) {
    at::mul_out(view, grad, average_scale_);
  } else {
    view.copy_(grad);
  }
  // gradient_as_bucket_view: .grad is the view from now on, as PyTorch's reducer makes it at this
  // copy, so that autograd's tensor goes at once. Made so only at the end of backward, every
  // parameter's fresh gradient (zero_grad sets them to none) stayed alive beside the buckets: one
  // more copy of all gradients at the peak (+65 MiB, 1.19x PyTorch's, on the 25M MLP: an audit,
  // 2026-12-07). No .grad: left for write_back_gradients, which leaves a globally unused one none.
  if (options_.gradient_as_bucket_view() && grad.defined()) grad = view;
}

void Reducer::launch_ready_buckets() {
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].pending == 0) {
    const std::size_t index = next_bucket_++;
    buckets_[index].work = reduce(buckets_[index], index);
  }
}

Work Reducer::reduce(Bucket& bucket, std::size_t index) {
  if (leaves_gradients()) return Work();  // Note [Nothing to reduce alone]: no buffer to reduce
  if (!hook_) return all_reduce_async(group_, bucket.buffer, ReduceOp::kSum);  // scaled on the way in
  GradBucket view;
  view.index = static_cast<int>(index);
  view.is_last = index + 1 == buckets_.size();
  view.buffer = bucket.buffer;
  for (std::size_t i : bucket.params) view.parameters.push_back(params_[i]);
  return hook_->run(group_, view);
}

void Reducer::finish_backward() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (state_ != BackwardState::kExpecting) return;
  if (next_bucket_ < buckets_.size()) {
    if (!detects_unused()) {
      state_ = BackwardState::kUnfinished;  // reported at the next forward, as PyTorch does
      return;
    }
    for (std::size_t i = 0; i < params_.size(); ++i) {
      if (!ready_[i]) mark_ready(i, /*used=*/false);
    }
    launch_ready_buckets();
  }
  complete_reduction();
}

void Reducer::complete_reduction() {
  for (auto& bucket : buckets_) bucket.work.wait();
  std::vector<bool> globally_used(params_.size(), true);
  if (static_unused_) {
    for (std::size_t i = 0; i < params_.size(); ++i) globally_used[i] = !static_unused_->everywhere[i];
  } else if (detects_unused()) {
    globally_used = reduce_used_flags();
    if (options_.static_graph()) remember_static_unused(globally_used);
  }
  write_back_gradients(globally_used);
  ++synced_backwards_;
  state_ = BackwardState::kIdle;
}

void Reducer::remember_static_unused(const std::vector<bool>& globally_used) {
  StaticUnused unused;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    unused.here.push_back(!used_here_[i]);
    unused.everywhere.push_back(!globally_used[i]);
  }
  static_unused_ = std::move(unused);
}

std::vector<bool> Reducer::reduce_used_flags() {
  auto flags = at::zeros({static_cast<int64_t>(params_.size())}, at::kInt);
  auto* data = flags.data_ptr<int>();
  for (std::size_t i = 0; i < params_.size(); ++i) data[i] = used_here_[i] ? 1 : 0;
  all_reduce(group_, flags, ReduceOp::kMax);
  std::vector<bool> used(params_.size());
  for (std::size_t i = 0; i < params_.size(); ++i) used[i] = data[i] != 0;
  return used;
}

void Reducer::write_back_gradients(const std::vector<bool>& globally_used) {
  if (leaves_gradients()) return;  // Note [Nothing to reduce alone]
  at::NoGradGuard no_grad;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (!globally_used[i]) continue;  // no rank produced a gradient: leave .grad as it was
    at::Tensor view = slot(i);
    at::Tensor& grad = params_[i].mutable_grad();
    if (options_.gradient_as_bucket_view()) {
      grad = view;
    } else if (grad.defined()) {
      grad.copy_(view);
    } else {
      grad = view.clone();  // unused here but used elsewhere: the average still applies
    }
  }
}

void Reducer::reduce_accumulated() {
  std::lock_guard<std::mutex> lock(mutex_);
  // Armed by prepare_for_last_backward: its hooks reduced what became ready; else nothing is.
  if (!(state_ == BackwardState::kExpecting && manual_end_)) expect_gradients();
  // Every gradient is in: a parameter without one took no part on this rank.
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (!ready_[i]) mark_ready(i, /*used=*/params_[i].grad().defined());
  }
  launch_ready_buckets();
  complete_reduction();
}

void Reducer::reduce_as_joined_rank() {
  std::lock_guard<std::mutex> lock(mutex_);
  used_here_.assign(params_.size(), false);
  // Alone there is no other rank to shadow, and no buffer (Note [Nothing to reduce alone]).
  // Every bucket launched, then waited in index order, as the active ranks' backward does: a
  // hook's work may issue collectives of its own when waited (PowerSGD's Q, Note [PowerSGD's
  // chain of work]), after all buckets' first ones on the active ranks. PyTorch's
  // _match_all_reduce_for_bwd_pass likewise runs every bucket's hook before waiting on any.
  if (!leaves_gradients()) {
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      buckets_[b].buffer.zero_();
      buckets_[b].work = reduce(buckets_[b], b);
    }
    for (auto& bucket : buckets_) bucket.work.wait();
  }
  if (detects_unused()) {
    auto globally_used = reduce_used_flags();
    if (options_.static_graph()) remember_static_unused(globally_used);
  }
  ++synced_backwards_;
}

}  // namespace cpprun::detail
