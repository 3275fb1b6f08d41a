// See gradient_sync.h.
#include "fsdp/gradient_sync.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/engine.h>

namespace cpprun::detail {
GradientSync::GradientSync(std::vector<FlatParam>& flats, ProcessGroup group, int stage,
                           std::optional<at::ScalarType> reduce_dtype, std::function<void(std::size_t)> unit_done,
                           std::size_t max_in_flight)
    : flats_(flats),
      group_(std::move(group)),
      stage_(stage),
      reduce_dtype_(reduce_dtype),
      unit_done_(std::move(unit_done)),
      units_(flats.size()),
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
  UnitState& unit = units_[f];
  if (!unit.flat_grad.defined()) {
    unit.flat_grad = at::zeros_like(flats_[f].full());
  } else if (unit.reduced) {
    unit.flat_grad.zero_();  // the optimizer zeroed only its shard of it
  }
  unit.reduced = false;
  at::NoGradGuard no_grad;
  for (std::size_t i = 0; i < flats_[f].params().size(); ++i) {
    // Autograd adds each new gradient into this view in place: no copy into a bucket.
    flats_[f].params()[i].mutable_grad() = flats_[f].slot(unit.flat_grad, i);
  }
}

void GradientSync::prepare(bool sync) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (std::size_t f = 0; f < flats_.size(); ++f) {
    // Stages 2 and 3 collect gradients as they come; under no_sync, .grad accumulates as usual.
    if (stage_ == 1) bind_flat_grad(f);
    units_[f].pending = flats_[f].params().size();
    units_[f].completed = false;
    units_[f].work = Work();
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
  if (--units_[f].pending == 0 && unit_done_) unit_done_(f);
  launch_ready_units();
}

// Stages 2 and 3: the parameter's gradient (this backward's, plus any no_sync accumulation) moves into
// the unit's flat gradient, allocated when the unit's first gradient arrives.
void GradientSync::collect(std::size_t f, std::size_t i) {
  UnitState& unit = units_[f];
  at::Tensor& grad = flats_[f].params()[i].mutable_grad();
  if (!grad.defined()) return;
  if (!unit.flat_grad.defined()) {
    unit.flat_grad = new_flat_grad(f, grad.options());
    note_gradient_bytes();
  }
  at::NoGradGuard no_grad;
  flats_[f].slot(unit.flat_grad, i).copy_(grad);
  grad = at::Tensor();
}

// Note [FSDP reduction order]
// Units were planned in registration order, so backward tends to finish them last to first.
// Every rank reduces them in that fixed order (the k-th launched only after the ones before),
// because collectives are matched by the order ranks issue them.
void GradientSync::launch_ready_units() {
  while (next_launch_ < units_.size()) {
    const std::size_t f = units_.size() - 1 - next_launch_;
    UnitState& unit = units_[f];
    if (unit.pending != 0) return;
    if (!unit.flat_grad.defined()) {  // stage 2 or 3, and no parameter of the unit got a gradient
      unit.flat_grad = new_flat_grad(f, flats_[f].full().options());
      note_gradient_bytes();
    }
    const bool convert = reduce_dtype_ && *reduce_dtype_ != unit.flat_grad.scalar_type();
    unit.wire = convert ? unit.flat_grad.to(*reduce_dtype_) : unit.flat_grad;
    if (stage_ == 1) {
      unit.work = all_reduce_async(group_, unit.wire, ReduceOp::kAvg);
    } else {
      if (!unit.shard_grad.defined()) unit.shard_grad = at::zeros({flats_[f].shard_numel()}, unit.wire.options());
      unit.work = reduce_scatter_async(group_, unit.shard_grad, unit.wire, ReduceOp::kAvg);
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

// Waits for the unit's reduction and hands its result to the shard's gradient.
void GradientSync::complete(std::size_t f) {
  UnitState& unit = units_[f];
  if (unit.completed) return;
  unit.completed = true;
  unit.work.wait();
  const FlatParam& flat = flats_[f];
  at::NoGradGuard no_grad;
  at::Tensor& shard_grad = flat.shard().mutable_grad();
  const auto master_dtype = flat.shard().scalar_type();
  unit.reduced = true;
  if (stage_ == 1) {
    if (!flat.shard_is_separate() && unit.wire.scalar_type() == master_dtype) {
      shard_grad = alias_into(unit.wire, flat.shard_offset(), {flat.shard_numel()});
    } else {  // mixed precision: the master shard's gradient, in its own dtype
      shard_grad = unit.wire.narrow(0, flat.shard_offset(), flat.shard_numel()).to(master_dtype, false, /*copy=*/true);
    }
    if (!unit.wire.is_same(unit.flat_grad)) unit.wire = at::Tensor();
    return;
  }
  // Where the shard lives elsewhere (CPU offload) or in another dtype (mixed precision), its
  // gradient is a copy, kept across steps.
  const at::Tensor& master = flat.shard();
  if (unit.shard_grad.scalar_type() == master_dtype && unit.shard_grad.device() == master.device()) {
    shard_grad = unit.shard_grad;
  } else if (shard_grad.defined() && shard_grad.sizes() == master.sizes() && !shard_grad.is_same(unit.shard_grad)) {
    shard_grad.copy_(unit.shard_grad);
  } else {
    shard_grad = unit.shard_grad.to(master.device(), master_dtype);
  }
  unit.wire = at::Tensor();
  // Stages 2 and 3 keep only the shard's gradient: release the full one until the next backward.
  for (const auto& param : flat.params()) param.mutable_grad() = at::Tensor();
  release_flat_grad(unit);
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

void GradientSync::release_flat_grad(UnitState& unit) {
  at::Tensor grad = std::move(unit.flat_grad);
  unit.flat_grad = at::Tensor();
  std::size_t alive = spare_grads_.size();
  for (const auto& u : units_) alive += u.flat_grad.defined() ? 1 : 0;
  if (alive < max_in_flight_ + 1) spare_grads_.push_back(std::move(grad));
}

void GradientSync::finish_backward() {
  std::function<void()> backward_end;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (mode_ != Mode::kSync) return;
    // Parameters that got no gradient contribute zeros (stage 1 and 2: already in their place).
    for (std::size_t f = 0; f < units_.size(); ++f) {
      if (stage_ >= 2) {
        for (std::size_t i = 0; i < flats_[f].params().size(); ++i) collect(f, i);
      }
      if (units_[f].pending != 0 && unit_done_) unit_done_(f);
      units_[f].pending = 0;
    }
    launch_ready_units();
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
  for (const auto& unit : units_) {
    if (unit.flat_grad.defined()) bytes += unit.flat_grad.nbytes();
    if (unit.shard_grad.defined()) bytes += unit.shard_grad.nbytes();
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
