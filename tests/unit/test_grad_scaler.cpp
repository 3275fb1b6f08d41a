// cpprun::GradScaler in one process: torch.amp.GradScaler's growth and backoff, skipped steps on
// overflow, the order checks, and save/load.
#include "catch.h"
#include <torch/torch.h>

#include <limits>

#include "cpprun/grad_scaler.h"

namespace {

// One step of y = w * x: returns whether the scaler stepped. `poison` puts an inf in the gradient.
bool train_step(cpprun::GradScaler& scaler, torch::optim::SGD& opt, torch::Tensor& w, bool poison) {
  opt.zero_grad();
  scaler.scale((w * 3).sum()).backward();
  if (poison) w.mutable_grad()[0] = std::numeric_limits<float>::infinity();
  const bool stepped = scaler.step(opt);
  scaler.update();
  return stepped;
}

// `from` saved to an archive's bytes and loaded into `into`, as a checkpoint carries a scaler.
void save_and_load(const cpprun::GradScaler& from, cpprun::GradScaler& into) {
  torch::serialize::OutputArchive out;
  from.save(out);
  std::stringstream buffer;
  out.save_to(buffer);
  torch::serialize::InputArchive in;
  in.load_from(buffer);
  into.load(in);
}

}  // namespace

TEST_CASE("grad_scaler: grows after growth_interval clean steps, backs off and skips on overflow", "[grad_scaler]") {
  auto w = torch::ones({2}).requires_grad_();
  torch::optim::SGD opt({w}, 0.1);
  cpprun::GradScaler scaler(cpprun::GradScalerOptions().init_scale(8).growth_interval(2));
  CHECK(scaler.get_scale() == 8);

  CHECK(train_step(scaler, opt, w, false));
  CHECK(scaler.get_scale() == 8);
  CHECK(scaler.growth_tracker() == 1);
  // Unscaled before the step: w moved by lr * 3, not lr * 3 * 8.
  CHECK(torch::allclose(w, torch::full({2}, 1 - 0.3)));
  CHECK(train_step(scaler, opt, w, false));
  CHECK(scaler.get_scale() == 16);
  CHECK(scaler.growth_tracker() == 0);

  const auto before = w.detach().clone();
  CHECK_FALSE(train_step(scaler, opt, w, true));
  CHECK(torch::equal(w, before));  // skipped
  CHECK(scaler.get_scale() == 8);
  CHECK(scaler.growth_tracker() == 0);

  CHECK(train_step(scaler, opt, w, false));  // recovers
  CHECK_FALSE(torch::equal(w, before));
}

TEST_CASE("grad_scaler: growth_factor multiplies the scale after each growth_interval clean steps", "[grad_scaler]") {
  auto w = torch::ones({2}).requires_grad_();
  torch::optim::SGD opt({w}, 0.1);
  cpprun::GradScaler scaler(cpprun::GradScalerOptions().init_scale(8).growth_factor(3).growth_interval(2));
  CHECK(train_step(scaler, opt, w, false));
  CHECK(scaler.get_scale() == 8);
  CHECK(train_step(scaler, opt, w, false));
  CHECK(scaler.get_scale() == 24);  // 8 * 3, not the default's 16
  CHECK(train_step(scaler, opt, w, false));
  CHECK(train_step(scaler, opt, w, false));
  CHECK(scaler.get_scale() == 72);
  CHECK_FALSE(train_step(scaler, opt, w, true));
  CHECK(scaler.get_scale() == 36);  // backoff_factor is still 0.5
}

TEST_CASE("grad_scaler: a NaN is an overflow too, and unscale_ before step is not repeated", "[grad_scaler]") {
  auto w = torch::ones({2}).requires_grad_();
  torch::optim::SGD opt({w}, 0.1);
  cpprun::GradScaler scaler(cpprun::GradScalerOptions().init_scale(4));
  scaler.scale((w * w).sum()).backward();
  scaler.unscale_(opt);
  CHECK(torch::allclose(w.grad(), torch::full({2}, 2.0)));  // unscaled once, not again by step()
  CHECK_THROWS_WITH(scaler.unscale_(opt), Catch::Contains("already called"));
  w.mutable_grad()[1] = std::numeric_limits<float>::quiet_NaN();  // after the check: not seen
  CHECK(scaler.step(opt));
  CHECK_THROWS_WITH(scaler.step(opt), Catch::Contains("update()"));
  scaler.update();

  opt.zero_grad();
  scaler.scale((w * w).sum()).backward();
  w.mutable_grad()[1] = std::numeric_limits<float>::quiet_NaN();
  CHECK_FALSE(scaler.step(opt));
  scaler.update();
  CHECK(scaler.get_scale() == 2);
}

TEST_CASE("grad_scaler: misuse is named", "[grad_scaler]") {
  auto w = torch::ones({1}).requires_grad_();
  torch::optim::SGD opt({w}, 0.1);
  cpprun::GradScaler scaler;
  CHECK_THROWS_WITH(scaler.unscale_(opt), Catch::Contains("unscale_() before any scale()"));
  CHECK_THROWS_WITH(scaler.step(opt), Catch::Contains("step() before any scale()"));
  CHECK_THROWS_WITH(scaler.update(), Catch::Contains("without a step()"));
  cpprun::GradScaler bad(cpprun::GradScalerOptions().backoff_factor(2));
  CHECK_THROWS_WITH(bad.scale(w.sum()), Catch::Contains("backoff_factor"));
  // No gradient to check: PyTorch's "No inf checks were recorded", not a silent step.
  cpprun::GradScaler no_backward;
  no_backward.scale(w.sum());
  no_backward.unscale_(opt);  // allowed, as PyTorch's: step() refuses
  CHECK_THROWS_WITH(no_backward.step(opt), Catch::Contains("No inf checks were recorded for this optimizer"));
  CHECK_THROWS_WITH(no_backward.update(), Catch::Contains("without a step()"));
}

TEST_CASE("grad_scaler: disabled is a pass-through", "[grad_scaler]") {
  auto w = torch::ones({1}).requires_grad_();
  torch::optim::SGD opt({w}, 0.1);
  cpprun::GradScaler scaler(cpprun::GradScalerOptions().enabled(false));
  auto loss = (w * 2).sum();
  CHECK(scaler.scale(loss).item<double>() == loss.item<double>());
  loss.backward();
  CHECK(scaler.step(opt));
  scaler.update();
  CHECK(scaler.get_scale() == 1.0);
}

TEST_CASE("grad_scaler: save and load keep the scale and the growth count", "[grad_scaler]") {
  auto w = torch::ones({1}).requires_grad_();
  torch::optim::SGD opt({w}, 0.1);
  cpprun::GradScaler scaler(cpprun::GradScalerOptions().init_scale(32).growth_interval(5));
  train_step(scaler, opt, w, false);
  train_step(scaler, opt, w, true);
  train_step(scaler, opt, w, false);
  cpprun::GradScaler restored(cpprun::GradScalerOptions().growth_interval(5));
  save_and_load(scaler, restored);
  CHECK(restored.get_scale() == 16);
  CHECK(restored.growth_tracker() == 1);
}

// PyTorch's load_state_dict restores growth_factor, backoff_factor and growth_interval too: a
// scaler built with other ones runs the saved schedule after load (it kept its own before).
TEST_CASE("grad_scaler: load restores the saved growth schedule, as PyTorch's", "[grad_scaler]") {
  auto w = torch::ones({1}).requires_grad_();
  torch::optim::SGD opt({w}, 0.1);
  cpprun::GradScaler scaler(
      cpprun::GradScalerOptions().init_scale(32).growth_factor(4).backoff_factor(0.25).growth_interval(2));
  cpprun::GradScaler restored;  // PyTorch's defaults: 2.0, 0.5, 2000
  save_and_load(scaler, restored);
  train_step(restored, opt, w, true);  // an overflow: 32 * 0.25
  CHECK(restored.get_scale() == 8);
  train_step(restored, opt, w, false);
  train_step(restored, opt, w, false);  // two clean steps: 8 * 4
  CHECK(restored.get_scale() == 32);
  // As PyTorch's: a disabled scaler loads nothing; an enabled one refuses a disabled one's state.
  cpprun::GradScaler disabled(cpprun::GradScalerOptions().enabled(false));
  save_and_load(scaler, disabled);
  CHECK(disabled.get_scale() == 1.0);
  CHECK_THROWS_WITH(save_and_load(disabled, restored), Catch::Contains("saved from a disabled GradScaler"));
  CHECK(restored.get_scale() == 32);
}
