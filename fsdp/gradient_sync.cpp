// See gradient_sync.h.
#include "fsdp/gradient_sync.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/engine.h>

namespace cpprun::detail {
GradientSync::GradientSync(std::vector<FlatParam>& flats, const ShardGroups& groups, int stage,
                           std::optional<at::ScalarType> reduce_dtype, std::function<void(std::size_t)> flat_done,
                           std::size_t max_in_flight)
    : flats_(flats),
      group_(groups.shard),
      replicate_(groups.replicate),
      stage_(stage),
      reduce_dtype_(reduce_dtype),
      flat_done_(std::move(flat_done)),
      states_(flats.size()),
      max_in_flight_(max_in_flight) {
  for (std::size_t f = 0; f < flats_.size(); ++f) {
    for (std::size_t i = 0; i < flats_[f].params().size(); ++i) {
      hooks_.add(flats_[f].params()[i], [this, f, i] { on_gradient_ready(f, i); });
    }
  }
}

GradientSync::~GradientSync() = default;

// A fresh backward starts from zero unless no_sync backwards are accumulating in flat_grad.
void GradientSync::bind_flat_grad(std::size_t f) {
  FlatState& state = states_[f];
  if (!state.flat_grad.defined()) {
    state.flat_grad = at::zeros_like(flats_[f].full());
  } else if (state.reduced) {
    state.flat_grad.zero_();  // the optimizer zeroed only its shard of it
  }
  state.reduced = false;
  at::NoGradGuard no_grad;
  for (std::size_t i = 0; i < flats_[f].params().size(); ++i) {
    // Autograd adds each new gradient into this view in place: no copy into a bucket.
    flats_[f].params()[i].mutable_grad() = flats_[f].slot(state.flat_grad, i);
  }
}

void GradientSync::prepare(bool sync) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (std::size_t f = 0; f < flats_.size(); ++f) {
    // Stages 2 and 3 collect gradients as they come; under no_sync, .grad accumulates as usual.
    if (stage_ == 1) bind_flat_grad(f);
    states_[f].pending = flats_[f].params().size();
    states_[f].completed = false;
    states_[f].work = Work();
  }
  note_gradient_bytes();
  mode_ = sync ? Mode::kSync : Mode::kNoSync;
  finish_queued_ = false;
  next_launch_ = 0;
  in_flight_.clear();
}

void GradientSync::on_gradient_ready(std::size_t f, std::size_t i) {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(mode_ != Mode::kFinished, "cpprun::FullyShardedDataParallel: backward reached the parameters again after "
              "the gradients of the last forward were already reduced (a second backward through the same graph, "
              "e.g. with retain_graph). Run the wrapped module's forward before each backward.");
  if (mode_ == Mode::kNoSync) return;
  if (!finish_queued_) {
    finish_queued_ = true;
    torch::autograd::Engine::get_default_engine().queue_callback([this] { finish_backward(); });
  }
  if (stage_ >= 2) collect(f, i);
  if (--states_[f].pending == 0 && flat_done_) flat_done_(f);
  launch_ready_flats();
}

// Stages 2 and 3: the parameter's gradient (this backward's, plus any no_sync accumulation) moves into
// its flat gradient, allocated when the flat parameter's first gradient arrives.
void GradientSync::collect(std::size_t f, std::size_t i) {
  FlatState& state = states_[f];
  at::Tensor& grad = flats_[f].params()[i].mutable_grad();
  if (!grad.defined()) return;
  if (!state.flat_grad.defined()) {
    state.flat_grad = new_flat_grad(f, grad.options());
    note_gradient_bytes();
  }
  at::NoGradGuard no_grad;
  flats_[f].slot(state.flat_grad, i).copy_(grad);
  grad = at::Tensor();
}

// Note [FSDP reduction order]
// Units were planned in registration order, so backward tends to finish them last to first.
// Every rank reduces them in that fixed order (the k-th launched only after the ones before),
// because collectives are matched by the order ranks issue them.
void GradientSync::launch_ready_flats() {
  while (next_launch_ < states_.size()) {
    const std::size_t f = states_.size() - 1 - next_launch_;
    FlatState& state = states_[f];
    if (state.pending != 0) return;
    if (!state.flat_grad.defined()) {  // stage 2 or 3, and none of its parameters got a gradient
      state.flat_grad = new_flat_grad(f, flats_[f].full().options());
      note_gradient_bytes();
    }
    const bool convert = reduce_dtype_ && *reduce_dtype_ != state.flat_grad.scalar_type();
    state.wire = convert ? state.flat_grad.to(*reduce_dtype_) : state.flat_grad;
    if (stage_ == 1) {
      state.work = all_reduce_async(group_, state.wire, ReduceOp::kAvg);
    } else {
      if (!state.shard_grad.defined()) state.shard_grad = at::zeros({flats_[f].shard_numel()}, state.wire.options());
      state.work = reduce_scatter_async(group_, state.shard_grad, state.wire, ReduceOp::kAvg);
    }
    ++next_launch_;
    if (stage_ >= 2) {
      // Bound the flat gradients alive at once: finish the oldest reduction before going on.
      in_flight_.push_back(f);
      while (in_flight_.size() > max_in_flight_) {
        complete(in_flight_.front());
        in_flight_.pop_front();
      }
    }
  }
}

// Waits for flat parameter f's reduction and hands its result to the shard's gradient.
void GradientSync::complete(std::size_t f) {
  FlatState& state = states_[f];
  if (state.completed) return;
  state.completed = true;
  state.work.wait();
  const FlatParam& flat = flats_[f];
  if (replicate_) {
    // Note [HSDP gradient reduction]
    // The shard group has averaged its ranks' gradients; the replicas, each another slice of the
    // batch, now average the part this rank keeps: Ψ/S elements cross the replicate dimension,
    // not Ψ. Stage 1's flat gradient outside the shard keeps the shard group's average only:
    // nothing reads it (the optimizer steps the shard). Synchronous, in the order every rank
    // completes its flat parameters (see Note [FSDP reduction order]).
    at::Tensor mine = stage_ == 1 ? state.wire.narrow(0, flat.shard_offset(), flat.shard_numel()) : state.shard_grad;
    all_reduce(*replicate_, mine, ReduceOp::kAvg);
  }
  at::NoGradGuard no_grad;
  at::Tensor& shard_grad = flat.shard().mutable_grad();
  const auto master_dtype = flat.shard().scalar_type();
  state.reduced = true;
  if (stage_ == 1) {
    if (!flat.shard_is_separate() && state.wire.scalar_type() == master_dtype) {
      shard_grad = alias_into(state.wire, flat.shard_offset(), {flat.shard_numel()});
    } else {  // mixed precision: the master shard's gradient, in its own dtype
      shard_grad = state.wire.narrow(0, flat.shard_offset(), flat.shard_numel()).to(master_dtype, false, /*copy=*/true);
    }
    if (!state.wire.is_same(state.flat_grad)) state.wire = at::Tensor();
    return;
  }
  // Where the shard lives elsewhere (CPU offload) or in another dtype (mixed precision), its
  // gradient is a copy, kept across steps.
  const at::Tensor& master = flat.shard();
  if (state.shard_grad.scalar_type() == master_dtype && state.shard_grad.device() == master.device()) {
    shard_grad = state.shard_grad;
  } else if (shard_grad.defined() && shard_grad.sizes() == master.sizes() && !shard_grad.is_same(state.shard_grad)) {
    shard_grad.copy_(state.shard_grad);
  } else {
    shard_grad = state.shard_grad.to(master.device(), master_dtype);
  }
  state.wire = at::Tensor();
  // Stages 2 and 3 keep only the shard's gradient: release the full one until the next backward.
  for (const auto& param : flat.params()) param.mutable_grad() = at::Tensor();
  release_flat_grad(state);
}

at::Tensor GradientSync::new_flat_grad(std::size_t f, const at::TensorOptions& options) {
  const int64_t numel = flats_[f].padded_numel();
  for (auto it = spare_grads_.begin(); it != spare_grads_.end(); ++it) {
    if (it->numel() == numel && it->dtype() == options.dtype() && it->device() == options.device()) {
      at::Tensor grad = std::move(*it);
      spare_grads_.erase(it);
      return grad.zero_();
    }
  }
  if (!spare_grads_.empty()) spare_grads_.erase(spare_grads_.begin());  // one that does not fit goes
  return at::zeros({numel}, options);
}

void GradientSync::release_flat_grad(FlatState& state) {
  at::Tensor grad = std::move(state.flat_grad);
  state.flat_grad = at::Tensor();
  std::size_t alive = spare_grads_.size();
  for (const auto& u : states_) alive += u.flat_grad.defined() ? 1 : 0;
  if (alive < max_in_flight_ + 1) spare_grads_.push_back(std::move(grad));
}

void GradientSync::finish_backward() {
  std::function<void()> backward_end;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (mode_ != Mode::kSync) return;
    // Parameters that got no gradient contribute zeros (stage 1 and 2: already in their place).
    for (std::size_t f = 0; f < states_.size(); ++f) {
      if (stage_ >= 2) {
        for (std::size_t i = 0; i < flats_[f].params().size(); ++i) collect(f, i);
      }
      if (states_[f].pending != 0 && flat_done_) flat_done_(f);
      states_[f].pending = 0;
    }
    launch_ready_flats();
    for (std::size_t f = 0; f < flats_.size(); ++f) complete(f);
    in_flight_.clear();
    mode_ = Mode::kFinished;
    shards_stepped_ = true;
    backward_end = backward_end_;
  }
  if (backward_end) backward_end();
}

bool GradientSync::take_shards_stepped() {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::exchange(shards_stepped_, false);
}

int64_t GradientSync::gradient_bytes() const {
  int64_t bytes = 0;
  for (const auto& state : states_) {
    if (state.flat_grad.defined()) bytes += state.flat_grad.nbytes();
    if (state.shard_grad.defined()) bytes += state.shard_grad.nbytes();
  }
  return bytes;
}

int64_t GradientSync::spare_bytes() const {
  int64_t bytes = 0;
  for (const auto& grad : spare_grads_) bytes += grad.nbytes();
  return bytes;
}

int64_t GradientSync::kept_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return spare_bytes();
}

void GradientSync::note_gradient_bytes() { peak_bytes_ = std::max(peak_bytes_, gradient_bytes() + spare_bytes()); }

int64_t GradientSync::peak_gradient_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::max(peak_bytes_, gradient_bytes() + spare_bytes());
}

}  // namespace cpprun::detail
