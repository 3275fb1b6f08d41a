// See cpprun/grad_scaler.h. The arithmetic is ATen's own (_amp_foreach_non_finite_check_and_unscale_,
// _amp_update_scale_), so the growth and backoff follow torch.amp.GradScaler step for step.
#include "cpprun/grad_scaler.h"

#include <ATen/ATen.h>
#include <torch/serialize/tensor.h>

#include <cmath>
#include <map>
#include <utility>
#include <vector>

#include "comm/group_membership.h"
#include "cpprun/collectives.h"

namespace cpprun {
GradScaler::GradScaler(GradScalerOptions options) : options_(options) {}

GradScaler::GradScaler(ProcessGroup group, GradScalerOptions options)
    : options_(options), group_(detail::member_group("GradScaler", std::move(group))) {}

void GradScaler::init_scale_like(const at::Tensor& like) {
  TORCH_CHECK(options_.init_scale() > 0 && options_.growth_factor() > 1 && options_.backoff_factor() > 0 &&
                  options_.backoff_factor() < 1 && options_.growth_interval() > 0,
              "cpprun::GradScaler: options must have init_scale > 0, growth_factor > 1, 0 < backoff_factor < 1 and "
              "growth_interval > 0; got init_scale ", options_.init_scale(), ", growth_factor ", options_.growth_factor(),
              ", backoff_factor ", options_.backoff_factor(), ", growth_interval ", options_.growth_interval());
  const auto device = like.device();
  if (!scale_.defined()) {
    scale_ = at::full({}, options_.init_scale(), at::TensorOptions().dtype(at::kFloat).device(device));
    growth_tracker_ = at::zeros({}, at::TensorOptions().dtype(at::kInt).device(device));
  } else if (scale_.device() != device) {  // loaded from a checkpoint on another device
    scale_ = scale_.to(device);
    growth_tracker_ = growth_tracker_.to(device);
  }
}

at::Tensor GradScaler::scale(const at::Tensor& loss) {
  if (!options_.enabled()) return loss;
  init_scale_like(loss);
  return loss * scale_;
}

// Note [A scaler built before the process group]
// A scaler held as a member or a global is often built before init_process_group(). Taking the
// default group at construction left such a scaler deciding overflows on each rank alone: under
// ZeRO-2/3 one rank skipped a step the others took, and from then on the ranks' scales differed
// and their scaled gradients were summed together (an audit, 2026-12-07). So the default group is
// looked up at each unscale_(), as ShardedGradScaler's dist.group.WORLD is, and not kept: a kept
// handle would outlive destroy_process_group() (a global scaler held the group's connections until
// exit) and miss a later init_process_group().
at::Tensor GradScaler::agreed_found_inf(const at::Tensor& local) const {
  if (group_) {
    all_reduce(*group_, local, ReduceOp::kMax);
  } else if (is_initialized()) {
    all_reduce(default_group(), local, ReduceOp::kMax);
  }
  return local;
}

void GradScaler::unscale_(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled()) return;
  PerOptimizer& state = per_optimizer_[&optimizer];
  TORCH_CHECK(state.stage != Stage::kUnscaled,
              "cpprun::GradScaler: unscale_() was already called on this optimizer since the last update(); call it "
              "at most once per optimizer per iteration");
  TORCH_CHECK(state.stage != Stage::kStepped,
              "cpprun::GradScaler: unscale_() after step(); call unscale_() before step() (step() unscales by itself)");
  TORCH_CHECK(scale_.defined(),
              "cpprun::GradScaler: unscale_() before any scale(): backward the loss returned by scaler.scale(loss)");

  // One fused check-and-unscale per device and dtype, as torch.amp.GradScaler groups them.
  std::map<std::pair<std::string, at::ScalarType>, std::vector<at::Tensor>> grads;
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& param : group.params()) {
      const at::Tensor& grad = param.grad();
      if (!grad.defined()) continue;
      TORCH_CHECK(!grad.is_sparse(), "cpprun::GradScaler: sparse gradients are not supported");
      grads[{grad.device().str(), grad.scalar_type()}].push_back(grad);
    }
  }
  at::NoGradGuard no_grad;
  const at::Tensor inv_scale = scale_.to(at::kDouble).reciprocal().to(at::kFloat);
  at::Tensor found_inf = at::zeros({1}, scale_.options());
  for (auto& [key, list] : grads) {
    const auto device = list.front().device();
    at::Tensor found_here = at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(device));
    at::_amp_foreach_non_finite_check_and_unscale_(list, found_here, inv_scale.to(device));
    found_inf.add_(found_here.to(found_inf.device()));
  }
  // Every rank takes part, with or without gradients, so that all decide alike; whether any rank
  // had a gradient rides along (a rank of ZeRO-3 or a pipeline stage may hold none; step() refuses
  // every rank none, as PyTorch's "No inf checks were recorded for this optimizer").
  const at::Tensor any_gradient = at::full({1}, grads.empty() ? 0.0 : 1.0, found_inf.options());
  const at::Tensor flags = agreed_found_inf(at::cat({found_inf, any_gradient}));
  state.found_inf = flags.narrow(0, 0, 1).clone();
  state.any_gradient = flags[1].item<float>() != 0.0f;
  state.stage = Stage::kUnscaled;
}

bool GradScaler::step(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled()) {
    optimizer.step();
    return true;
  }
  TORCH_CHECK(scale_.defined(),
              "cpprun::GradScaler: step() before any scale(): backward the loss returned by scaler.scale(loss)");
  PerOptimizer& state = per_optimizer_[&optimizer];
  TORCH_CHECK(state.stage != Stage::kStepped,
              "cpprun::GradScaler: step() was already called on this optimizer since the last update(); call "
              "update() once per iteration, after the steps");
  if (state.stage == Stage::kReady) unscale_(optimizer);
  if (!state.any_gradient) {
    per_optimizer_.erase(&optimizer);  // as if never stepped: a following update() says so
    TORCH_CHECK(false, "cpprun::GradScaler: no parameter of the optimizer has a gradient on any rank, so no inf "
                "checks were recorded for it (PyTorch: \"No inf checks were recorded for this optimizer.\"); call "
                "step() after the backward of scaler.scale(loss)");
  }
  const bool overflow = state.found_inf.item<float>() != 0.0f;
  if (!overflow) optimizer.step();
  state.stage = Stage::kStepped;
  return !overflow;
}

void GradScaler::update() {
  if (!options_.enabled()) return;
  TORCH_CHECK(!per_optimizer_.empty() && scale_.defined(),
              "cpprun::GradScaler: update() without a step() since the last one; call scaler.step(optimizer) first");
  at::Tensor found_inf = at::zeros({1}, scale_.options());
  for (const auto& [optimizer, state] : per_optimizer_) {
    if (state.found_inf.defined()) found_inf.add_(state.found_inf);
  }
  at::_amp_update_scale_(scale_, growth_tracker_, found_inf, options_.growth_factor(), options_.backoff_factor(),
                         options_.growth_interval());
  per_optimizer_.clear();
}

void GradScaler::update(double new_scale) {
  if (!options_.enabled()) return;
  TORCH_CHECK(new_scale > 0, "cpprun::GradScaler: update(new_scale) needs a positive scale, got ", new_scale);
  if (!scale_.defined()) init_scale_like(at::empty({0}));
  scale_.fill_(new_scale);
  per_optimizer_.clear();
}

double GradScaler::get_scale() const {
  if (!options_.enabled()) return 1.0;
  return scale_.defined() ? scale_.item<double>() : options_.init_scale();
}

int64_t GradScaler::growth_tracker() const { return growth_tracker_.defined() ? growth_tracker_.item<int64_t>() : 0; }

// What PyTorch's GradScaler.state_dict() holds: the scale, the growth count, and the factors and
// interval, which its load_state_dict() restores too (a resumed run keeps the schedule it had).
void GradScaler::save(torch::serialize::OutputArchive& archive) const {
  archive.write("grad_scaler/scale", at::full({}, get_scale(), at::kFloat));
  archive.write("grad_scaler/growth_tracker", at::full({}, growth_tracker(), at::kInt));
  archive.write("grad_scaler/growth_factor", at::full({}, options_.growth_factor(), at::kDouble));
  archive.write("grad_scaler/backoff_factor", at::full({}, options_.backoff_factor(), at::kDouble));
  archive.write("grad_scaler/growth_interval", at::full({}, options_.growth_interval(), at::kLong));
  archive.write("grad_scaler/enabled", at::full({}, options_.enabled(), at::kBool));
}

// As PyTorch's load_state_dict: a disabled scaler loads nothing; an enabled one refuses the state
// of a disabled one (its scale 1 is no loss scale).
void GradScaler::load(torch::serialize::InputArchive& archive) {
  if (!options_.enabled()) return;
  at::Tensor enabled;
  if (archive.try_read("grad_scaler/enabled", enabled)) {
    TORCH_CHECK(enabled.numel() == 1 && enabled.to(at::kBool).item<bool>(), "cpprun::GradScaler: the archive was "
                "saved from a disabled GradScaler (its scale 1 is no loss scale); load it into a disabled one, or "
                "start this one's scale afresh");
  }
  at::Tensor scale, tracker;
  archive.read("grad_scaler/scale", scale);
  archive.read("grad_scaler/growth_tracker", tracker);
  TORCH_CHECK(scale.numel() == 1 && scale.item<double>() > 0 && tracker.numel() == 1,
              "cpprun::GradScaler: the archive's grad_scaler/scale must be one positive number and growth_tracker one "
              "integer; got ", scale.numel(), " and ", tracker.numel(), " elements");
  // The schedule, from archives that hold it (older ones do not: the options stay).
  GradScalerOptions loaded = options_;
  at::Tensor value;
  const auto one = [&](const char* key) {
    value = at::Tensor();  // read() into a defined tensor would set_() it in place, dtype and all
    const bool found = archive.try_read(key, value);
    TORCH_CHECK(!found || value.numel() == 1, "cpprun::GradScaler: the archive's ", key, " must be one number; got ",
                value.numel(), " elements");
    return found;
  };
  if (one("grad_scaler/growth_factor")) loaded.growth_factor(value.item<double>());
  if (one("grad_scaler/backoff_factor")) loaded.backoff_factor(value.item<double>());
  if (one("grad_scaler/growth_interval")) loaded.growth_interval(value.item<int64_t>());
  TORCH_CHECK(std::isfinite(loaded.growth_factor()) && loaded.growth_factor() > 1 && loaded.backoff_factor() > 0 &&
                  loaded.backoff_factor() < 1 && loaded.growth_interval() > 0,
              "cpprun::GradScaler: the archive's schedule is not one GradScaler runs: growth_factor ",
              loaded.growth_factor(), " (> 1), backoff_factor ", loaded.backoff_factor(), " (0 to 1), growth_interval ",
              loaded.growth_interval(), " (> 0)");
  const auto device = scale_.defined() ? scale_.device() : at::Device(at::kCPU);
  scale_ = scale.to(device, at::kFloat).reshape({});
  growth_tracker_ = tracker.to(device, at::kInt).reshape({});
  options_ = loaded;
  per_optimizer_.clear();
}

}  // namespace cpprun
