// See gradient_sync.h.
#include "fsdp/gradient_sync.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/engine.h>

namespace cpprun::detail {
GradientSync::GradientSync(std::vector<FlatParam>& flats, ProcessGroup group, int stage,
                           std::optional<at::ScalarType> reduce_dtype)
    : flats_(flats), group_(std::move(group)), stage_(stage), reduce_dtype_(reduce_dtype), units_(flats.size()) {
  for (std::size_t f = 0; f < flats_.size(); ++f) {
    for (const auto& param : flats_[f].params()) hooks_.add(param, [this, f] { on_gradient_ready(f); });
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
    bind_flat_grad(f);
    units_[f].pending = flats_[f].params().size();
    units_[f].work = Work();
  }
  expecting_ = sync;
  finish_queued_ = false;
  next_launch_ = 0;
}

void GradientSync::on_gradient_ready(std::size_t f) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!expecting_) return;
  if (!finish_queued_) {
    finish_queued_ = true;
    torch::autograd::Engine::get_default_engine().queue_callback([this] { finish_backward(); });
  }
  --units_[f].pending;
  launch_ready_units();
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
    const bool convert = reduce_dtype_ && *reduce_dtype_ != unit.flat_grad.scalar_type();
    unit.wire = convert ? unit.flat_grad.to(*reduce_dtype_) : unit.flat_grad;
    if (stage_ == 1) {
      unit.work = all_reduce_async(group_, unit.wire, ReduceOp::kAvg);
    } else {
      if (!unit.shard_grad.defined()) unit.shard_grad = at::zeros({flats_[f].shard_numel()}, unit.wire.options());
      unit.work = reduce_scatter_async(group_, unit.shard_grad, unit.wire, ReduceOp::kAvg);
    }
    ++next_launch_;
  }
}

void GradientSync::finish_backward() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!expecting_) return;
  // Parameters that got no gradient contribute the zeros already in their place.
  for (auto& unit : units_) unit.pending = 0;
  launch_ready_units();
  at::NoGradGuard no_grad;
  for (std::size_t f = 0; f < flats_.size(); ++f) {
    UnitState& unit = units_[f];
    unit.work.wait();
    const FlatParam& flat = flats_[f];
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
    } else {
      shard_grad = unit.shard_grad.scalar_type() == master_dtype ? unit.shard_grad : unit.shard_grad.to(master_dtype);
      unit.wire = at::Tensor();
      // Stage 2 keeps only the shard's gradient: release the full one until the next backward.
      for (const auto& param : flats_[f].params()) param.mutable_grad() = at::Tensor();
      unit.flat_grad = at::Tensor();
    }
  }
  expecting_ = false;
  shards_stepped_ = true;
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

}  // namespace cpprun::detail
