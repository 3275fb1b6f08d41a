// cpprun::FusedAdamW against LibTorch's torch::optim::AdamW in float64 (where the two kernels'
// rounding cannot decide the verdict): parameter groups with their own lr and weight decay,
// amsgrad, parameters without a gradient, state saved and loaded (into either optimizer, and
// into one whose step count has moved on), and what it refuses.
#include "catch.h"
#include <torch/torch.h>

#include <sstream>
#include <vector>

#include "cpprun/fused_adamw.h"

namespace {

// A few tensors of different shapes, the same on every call.
std::vector<torch::Tensor> make_params() {
  torch::manual_seed(7);
  std::vector<torch::Tensor> params;
  for (auto shape : std::vector<std::vector<int64_t>>{{5, 3}, {3}, {4, 2, 2}, {1}}) {
    params.push_back(torch::randn(shape, torch::kDouble).requires_grad_());
  }
  return params;
}

// Two groups as train_gpt makes them: decay on the 2-D and larger, none on the rest, another lr.
std::vector<torch::optim::OptimizerParamGroup> make_groups(const std::vector<torch::Tensor>& p, bool amsgrad) {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<torch::Tensor>{p[0], p[2]},
                      std::make_unique<torch::optim::AdamWOptions>(
                          torch::optim::AdamWOptions(1e-2).weight_decay(0.1).amsgrad(amsgrad).betas({0.8, 0.95})));
  groups.emplace_back(std::vector<torch::Tensor>{p[1], p[3]},
                      std::make_unique<torch::optim::AdamWOptions>(
                          torch::optim::AdamWOptions(3e-2).weight_decay(0).amsgrad(amsgrad).eps(1e-6)));
  return groups;
}

// Gradients that differ each step; p[3] gets none on odd steps (skipped: no state change).
void set_grads(const std::vector<torch::Tensor>& params, int step) {
  for (size_t i = 0; i < params.size(); ++i) {
    auto& p = params[i];
    if (i == 3 && step % 2 == 1) {
      p.mutable_grad() = torch::Tensor();
      continue;
    }
    p.mutable_grad() = torch::sin(p.detach() * (step + 1) + static_cast<double>(i)) * (1.0 + step);
  }
}

void run_steps(torch::optim::Optimizer& optimizer, const std::vector<torch::Tensor>& params, int from, int to) {
  for (int step = from; step < to; ++step) {
    set_grads(params, step);
    optimizer.step();
  }
}

double max_difference(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, (a[i] - b[i]).abs().max().item<double>());
  return worst;
}

std::string saved(const torch::optim::Optimizer& optimizer) {
  std::ostringstream bytes;
  torch::save(optimizer, bytes);
  return bytes.str();
}

void load(torch::optim::Optimizer& optimizer, const std::string& bytes) {
  std::istringstream in(bytes);
  torch::load(optimizer, in);
}

}  // namespace

TEST_CASE("fused_adamw: steps as torch::optim::AdamW, per group, with amsgrad, skipping gradient-less parameters",
          "[fused_adamw]") {
  for (bool amsgrad : {false, true}) {
    auto fused_params = make_params(), reference_params = make_params();
    cpprun::FusedAdamW fused(make_groups(fused_params, amsgrad));
    torch::optim::AdamW reference(make_groups(reference_params, amsgrad));
    const auto start = fused_params[0].detach().clone();
    run_steps(fused, fused_params, 0, 6);
    run_steps(reference, reference_params, 0, 6);
    INFO("amsgrad " << amsgrad);
    CHECK(max_difference(fused_params, reference_params) < 1e-12);
    CHECK((fused_params[0] - start).abs().max().item<double>() > 1e-3);  // it moved
    // The state is AdamW's, step counts included (p[3] had a gradient on 3 of the 6 steps).
    auto& state = fused.state();
    auto& s3 = static_cast<torch::optim::AdamWParamState&>(*state.at(fused_params[3].unsafeGetTensorImpl()));
    auto& s0 = static_cast<torch::optim::AdamWParamState&>(*state.at(fused_params[0].unsafeGetTensorImpl()));
    CHECK(s3.step() == 3);
    CHECK(s0.step() == 6);
    CHECK(s0.max_exp_avg_sq().defined() == amsgrad);
  }
}

TEST_CASE("fused_adamw: state saved by either optimizer continues in the other, and a load resets the step count",
          "[fused_adamw]") {
  // The uninterrupted run: 7 steps of LibTorch's AdamW.
  auto straight_params = make_params();
  torch::optim::AdamW straight(make_groups(straight_params, false));
  run_steps(straight, straight_params, 0, 7);

  // Fused for 4 steps, its state and parameters kept, then 2 more steps (its device step counts at 6).
  auto params = make_params();
  cpprun::FusedAdamW fused(make_groups(params, false));
  run_steps(fused, params, 0, 4);
  const auto at_4 = saved(fused);
  std::vector<torch::Tensor> values_at_4;
  for (auto& p : params) values_at_4.push_back(p.detach().clone());
  run_steps(fused, params, 4, 6);

  SECTION("back to step 4 in the same optimizer: its step counts follow the loaded state") {
    load(fused, at_4);
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) params[i].copy_(values_at_4[i]);
  }
  SECTION("into LibTorch's AdamW") {
    auto other_params = make_params();
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) other_params[i].copy_(values_at_4[i]);
    torch::optim::AdamW other(make_groups(other_params, false));
    load(other, at_4);
    run_steps(other, other_params, 4, 7);
    CHECK(max_difference(other_params, straight_params) < 1e-12);
    return;
  }
  run_steps(fused, params, 4, 7);
  CHECK(max_difference(params, straight_params) < 1e-12);

  // And LibTorch's state into the fused one.
  auto libtorch_params = make_params();
  torch::optim::AdamW libtorch(make_groups(libtorch_params, false));
  run_steps(libtorch, libtorch_params, 0, 4);
  auto fused2_params = make_params();
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) fused2_params[i].copy_(libtorch_params[i]);
  }
  cpprun::FusedAdamW fused2(make_groups(fused2_params, false));
  load(fused2, saved(libtorch));
  run_steps(fused2, fused2_params, 4, 7);
  CHECK(max_difference(fused2_params, straight_params) < 1e-12);
}

TEST_CASE("fused_adamw: float32 and bfloat16 parameters step in one call each; a sparse gradient is refused",
          "[fused_adamw]") {
  auto a = torch::randn({8}, torch::kFloat).requires_grad_();
  auto b = torch::randn({8}, torch::kBFloat16).requires_grad_();
  const auto a0 = a.detach().clone(), b0 = b.detach().clone();
  cpprun::FusedAdamW mixed(std::vector<torch::Tensor>{a, b}, torch::optim::AdamWOptions(1e-1));
  a.mutable_grad() = torch::ones_like(a);
  b.mutable_grad() = torch::ones_like(b);
  mixed.step();
  // Adam's first step moves each element by lr (the normalised gradient is 1), less weight decay.
  CHECK(torch::allclose(a, a0 * (1 - 1e-1 * 1e-2) - 1e-1, 1e-5, 1e-5));
  CHECK(torch::allclose(b.to(torch::kFloat), (b0.to(torch::kFloat) * (1 - 1e-3) - 1e-1), 2e-2, 2e-2));

  auto table = torch::randn({4, 3}).requires_grad_();
  cpprun::FusedAdamW sparse({table}, torch::optim::AdamWOptions(1e-1));
  table.mutable_grad() = torch::eye(4).index({torch::indexing::Slice(0, 4), torch::indexing::Slice(0, 3)}).to_sparse();
  CHECK_THROWS_WITH(sparse.step(), Catch::Contains("sparse gradient") && Catch::Contains("torch::optim::AdamW"));
}

TEST_CASE("fused_adamw: count_replayed_steps advances the counts of the parameters the last step stepped",
          "[fused_adamw]") {
  auto params = make_params();
  cpprun::FusedAdamW optimizer(make_groups(params, false));
  set_grads(params, 1);  // p[3] has no gradient: not stepped
  optimizer.step();
  optimizer.count_replayed_steps(5);
  auto step_of = [&](size_t i) {
    return static_cast<torch::optim::AdamWParamState&>(*optimizer.state().at(params[i].unsafeGetTensorImpl())).step();
  };
  CHECK(step_of(0) == 6);
  CHECK(step_of(2) == 6);
  CHECK(optimizer.state().count(params[3].unsafeGetTensorImpl()) == 0);
  CHECK_THROWS_WITH(optimizer.count_replayed_steps(-1), Catch::Contains("0 or more"));
  optimizer.state().clear();
  CHECK_THROWS_WITH(optimizer.count_replayed_steps(1), Catch::Contains("no state any more"));
}
