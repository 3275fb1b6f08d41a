// FullyShardedDataParallel's FSDP2 controls (set_requires_gradient_sync, unshard, reshard,
// set_reshard_after_forward, set_reshard_after_backward, set_gradient_divide_factor,
// set_force_sum_reduction_for_comms, set_all_reduce_hook) under `cpprun --nproc_per_node=K`, in
// the cpprun_dist_fsdp binary. Parity against one process on the whole batch in float64 (Note
// [Parity in float64] in parity_checks.h); what each control keeps gathered through memory() and
// prefetch_stats(). HSDP's set_requires_all_reduce is in test_hsdp.cpp. CHECK, not REQUIRE,
// keeps every rank's collectives in step.
#include "catch.h"
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "comm/group_impl.h"  // p2p_bytes_sent
#include "cpprun/cpprun.h"
#include "ddp_test_models.h"
#include "dist_test_support.h"
#include "fsdp_test_models.h"
#include "parity_checks.h"
#include "parity_training.h"

using namespace ddp_test;

namespace {

using dist_test::group;
using dist_test::slice;

constexpr int64_t kGlobalBatch = 24;

// Whether any of this rank's shards has a gradient (zero_grad() sets them to none): a local
// backward leaves them so, a synchronized one sets them.
bool any_shard_grad(torch::nn::Module& model) {
  for (const auto& p : model.parameters()) {
    if (p.grad().defined()) return true;
  }
  return false;
}

torch::Tensor local_loss(const std::function<torch::Tensor(torch::Tensor)>& forward, int64_t batch) {
  const int rank = group().rank(), world = group().size();
  return torch::nn::functional::cross_entropy(forward(slice(inputs_for("mlp", kGlobalBatch, batch), rank, world)),
                                              slice(targets_for(kGlobalBatch, batch), rank, world));
}

// How the first micro-batches of each step are kept local.
enum class Local { kGuard, kSetterBeforeForward, kSetterBeforeBackward };

// Two steps of three micro-batches each, the first two local, with SGD; checked against one
// process on the whole batches. Returns the trained parameters.
std::vector<torch::Tensor> train_accumulating(int stage, Local how) {
  const int world = group().size();
  torch::manual_seed(0);
  auto net = std::make_shared<Mlp>(31);
  auto model = cpprun::FullyShardedDataParallel(net, group(), cpprun::FsdpOptions().stage(stage).wrap_policy(is_linear));
  auto ref = std::make_shared<Mlp>(31);
  copy_state(*ref, *net);
  torch::optim::SGD opt(model->parameters(), 0.1), ref_opt(ref->parameters(), 0.1);
  for (int step = 0; step < 2; ++step) {
    opt.zero_grad();
    ref_opt.zero_grad();
    for (int micro = 0; micro < 3; ++micro) {
      const bool last = micro == 2;
      const int64_t batch = 10 * step + micro;
      std::optional<cpprun::NoSyncGuard> guard;
      if (how == Local::kGuard && !last) guard.emplace(model->no_sync());
      if (how == Local::kSetterBeforeForward) model->set_requires_gradient_sync(last);
      auto loss = local_loss([&](torch::Tensor in) { return model->forward(in); }, batch);
      // As PyTorch's pipeline schedules do: decided after forward, for this backward.
      if (how == Local::kSetterBeforeBackward) model->set_requires_gradient_sync(last);
      loss.backward();
      INFO("micro-batch " << micro);
      CHECK(any_shard_grad(*model) == last);
      reference_backward([&](torch::Tensor in) { return ref->forward(in); }, inputs_for("mlp", kGlobalBatch, batch),
                         targets_for(kGlobalBatch, batch), world);
    }
    opt.step();
    ref_opt.step();
  }
  model->gather_full_parameters();
  check_same_parameters(*net, *ref, kParityTolerance);
  std::vector<torch::Tensor> trained;
  for (const auto& p : net->parameters()) trained.push_back(p.detach().clone());
  return trained;
}

}  // namespace

TEST_CASE("fsdp: set_requires_gradient_sync(false) accumulates locally until set back, as no_sync does", "[fsdp]") {
  Float64Parity float64;
  for (int stage : {1, 2, 3}) {
    INFO("stage " << stage);
    const auto guarded = train_accumulating(stage, Local::kGuard);
    for (Local how : {Local::kSetterBeforeForward, Local::kSetterBeforeBackward}) {
      const auto set = train_accumulating(stage, how);
      INFO("setter " << (how == Local::kSetterBeforeForward ? "before forward" : "between forward and backward"));
      REQUIRE(set.size() == guarded.size());
      // The same operations on the same values: the guard and the setter are one mechanism.
      for (std::size_t i = 0; i < set.size(); ++i) CHECK(set[i].equal(guarded[i]));
    }
  }
}

TEST_CASE("fsdp: a no_sync guard puts back the setting it found, set_requires_gradient_sync's included", "[fsdp]") {
  for (int stage : {1, 2, 3}) {
    INFO("stage " << stage);
    auto model = cpprun::FullyShardedDataParallel(std::make_shared<Mlp>(31), group(),
                                                  cpprun::FsdpOptions().stage(stage).wrap_policy(is_linear));
    torch::optim::SGD opt(model->parameters(), 0.1);
    auto forward = [&](torch::Tensor in) { return model->forward(in); };
    opt.zero_grad();
    model->set_requires_gradient_sync(false);
    {
      auto guard = model->no_sync();
      local_loss(forward, 0).backward();
    }
    CHECK_FALSE(any_shard_grad(*model));
    local_loss(forward, 1).backward();  // the guard put back false: still local
    CHECK_FALSE(any_shard_grad(*model));
    {
      auto guard = model->no_sync();
      model->set_requires_gradient_sync(true);  // lasts until the guard ends
    }
    local_loss(forward, 2).backward();
    CHECK_FALSE(any_shard_grad(*model));
    model->set_requires_gradient_sync(true);
    local_loss(forward, 3).backward();
    CHECK(any_shard_grad(*model));
  }
}

TEST_CASE("fsdp: unshard() gathers every unit now and reshard() releases them; stages 1 and 2 keep them", "[fsdp]") {
  Float64Parity float64;
  const int world = group().size();
  const bool alone = world == 1;  // Note [Nothing to shard alone]: stage 3 keeps them whole too
  for (int stage : {1, 2, 3}) {
    INFO("stage " << stage);
    const bool sharded = stage == 3 && !alone;
    torch::manual_seed(0);
    auto net = std::make_shared<Tower>();
    auto ref = std::make_shared<Tower>();
    copy_state(*ref, *net);
    auto model =
        cpprun::FullyShardedDataParallel(net, group(), cpprun::FsdpOptions().stage(stage).wrap_policy(is_block));
    const int64_t whole = 8 * padded_numel(*ref, world);
    torch::optim::SGD opt(model->parameters(), 0.1), ref_opt(ref->parameters(), 0.1);
    auto evaluate = [&] {  // returns the units it gathered ahead of use
      torch::NoGradGuard no_grad;
      const int64_t started = model->prefetch_stats().started;
      model->forward(inputs_for("mlp", kGlobalBatch, 99));
      return model->prefetch_stats().started - started;
    };
    for (int step = 0; step < 2; ++step) {
      opt.zero_grad();
      ref_opt.zero_grad();
      local_loss([&](torch::Tensor in) { return model->forward(in); }, step).backward();
      reference_backward([&](torch::Tensor in) { return ref->forward(in); }, inputs_for("mlp", kGlobalBatch, step),
                         targets_for(kGlobalBatch, step), world);
      if (step == 1) model->unshard();  // before the step: what it gathers goes stale
      opt.step();
      ref_opt.step();
      CHECK(model->memory().parameters == (sharded && step == 0 ? 0 : whole));
      model->unshard();
      CHECK(model->memory().parameters == whole);
      check_same_parameters(*net, *ref, kParityTolerance);  // the stepped values, now
      // Gathered in the step window (Note [Stale gathered units]): the next forward gathers anew.
      const int64_t gathered = evaluate();
      CHECK((sharded ? gathered > 0 : gathered == 0));
      CHECK(model->memory().parameters == (sharded ? 0 : whole));  // reshard_after_forward released them
      // Still in it (no forward with autograd since the backward; the step may yet come): an
      // unshard() and the evaluation after it gather anew too. Outside it units are used as
      // kept (set_reshard_after_forward's test).
      model->unshard();
      const int64_t again = evaluate();
      CHECK((sharded ? again > 0 : again == 0));
      check_same_parameters(*net, *ref, kParityTolerance);
      model->unshard();
      model->reshard();
      CHECK(model->memory().parameters == (sharded ? 0 : whole));
      CHECK(model->memory().kept == 0);  // freed, not kept for reuse
    }
    model->unshard();
    check_same_parameters(*net, *ref, kParityTolerance);
  }
}

TEST_CASE("fsdp: set_reshard_after_forward decides what forward keeps, in training and evaluation", "[fsdp]") {
  const int world = group().size();
  const bool alone = world == 1;
  auto tower = std::make_shared<Tower>();
  auto model = cpprun::FullyShardedDataParallel(tower, group(),
                                                cpprun::FsdpOptions().stage(3).wrap_policy(is_block).gathered_unit_limit(8));
  const int64_t root = 4 * (padded_numel(*tower->in, world) + padded_numel(*tower->out, world));
  const int64_t block = 4 * padded_numel(*tower->b0, world);
  const int64_t whole = root + 3 * block;
  auto forward = [&](torch::Tensor in) { return model->forward(in); };
  auto evaluate = [&] {
    torch::NoGradGuard no_grad;
    const int64_t started = model->prefetch_stats().started;
    model->forward(inputs_for("mlp", kGlobalBatch, 0));
    return model->prefetch_stats().started - started;  // units gathered ahead of use
  };

  auto loss = local_loss(forward, 0);  // default: the root and the unit used last stay for backward
  CHECK(model->memory().parameters == (alone ? whole : root + block));
  loss.backward();

  model->set_reshard_after_forward(false);
  CHECK_FALSE(model->options().reshard_after_forward());
  loss = local_loss(forward, 1);
  CHECK(model->memory().parameters == whole);
  {
    auto local = model->no_sync();  // a local backward: no optimizer step can follow it
    loss.backward();
  }
  CHECK(model->memory().parameters == (alone ? whole : 0));  // backward still releases them
  evaluate();
  CHECK(model->memory().parameters == whole);  // kept after a forward without autograd too
  CHECK(evaluate() == 0);                      // so the next one gathers nothing
  CHECK(model->memory().parameters == whole);
  // After a synchronized backward the optimizer may step before or between evaluations: each
  // gathers anew until a forward with autograd ends that window (Note [Stale gathered units]).
  local_loss(forward, 2).backward();
  if (!alone) {
    CHECK(evaluate() > 0);
    CHECK(evaluate() > 0);
  }
  {
    auto local = model->no_sync();
    local_loss(forward, 3).backward();  // a training forward ends the window
  }
  evaluate();
  CHECK(evaluate() == 0);

  model->set_reshard_after_forward(true);
  CHECK(model->options().reshard_after_forward());
  evaluate();
  CHECK(model->memory().parameters == (alone ? whole : 0));
  if (!alone) CHECK(evaluate() > 0);

  // Stages 1 and 2 keep the full parameters: false is what they do, true a clear error.
  auto stage2 = cpprun::FullyShardedDataParallel(std::make_shared<Mlp>(), group(), cpprun::FsdpOptions().stage(2));
  CHECK_NOTHROW(stage2->set_reshard_after_forward(false));
  CHECK_THROWS_WITH(stage2->set_reshard_after_forward(true),
                    Catch::Contains("stage 2 keeps the full parameters") && Catch::Contains("stage(3)"));
  CHECK_NOTHROW(stage2->set_reshard_after_backward(false));
  CHECK_THROWS_WITH(stage2->set_reshard_after_backward(true),
                    Catch::Contains("stage 2 keeps the full parameters") && Catch::Contains("stage(3)"));
}

// An evaluation forward between backward and the optimizer's step (a validation loss, a
// sample) must not count as the step's end: at stages 1 and 2 it consumed the "stepped" mark and
// the next training forward computed with the old parameters; at stage 3 with
// reshard_after_forward(false) it kept units gathered before the step.
TEST_CASE("fsdp: an evaluation forward between backward and step leaves the next forward the stepped parameters",
          "[fsdp]") {
  Float64Parity float64;
  const int world = group().size();
  for (int stage : {1, 2, 3}) {
    for (bool keep : {false, true}) {
      if (keep && stage != 3) continue;
      INFO("stage " << stage << (keep ? ", reshard_after_forward(false)" : ""));
      torch::manual_seed(0);
      auto net = std::make_shared<Mlp>(31);
      auto model =
          cpprun::FullyShardedDataParallel(net, group(), cpprun::FsdpOptions().stage(stage).wrap_policy(is_linear));
      if (keep) model->set_reshard_after_forward(false);
      auto ref = std::make_shared<Mlp>(31);
      copy_state(*ref, *net);
      torch::optim::SGD opt(model->parameters(), 0.1), ref_opt(ref->parameters(), 0.1);
      for (int step = 0; step < 3; ++step) {
        opt.zero_grad();
        ref_opt.zero_grad();
        local_loss([&](torch::Tensor in) { return model->forward(in); }, step).backward();
        reference_backward([&](torch::Tensor in) { return ref->forward(in); }, inputs_for("mlp", kGlobalBatch, step),
                           targets_for(kGlobalBatch, step), world);
        {
          torch::NoGradGuard no_grad;
          model->forward(inputs_for("mlp", kGlobalBatch, 90));  // before the step
        }
        opt.step();
        ref_opt.step();
        {
          torch::NoGradGuard no_grad;
          model->forward(inputs_for("mlp", kGlobalBatch, 91));  // after it, before the next training forward
        }
      }
      model->gather_full_parameters();
      check_same_parameters(*net, *ref, kParityTolerance);
    }
  }
}

// What an evaluation forward between the optimizer's step and the next training forward costs, in
// bytes this rank sent on the ring (Note [Stale gathered units]): it all-gathers what it uses, and
// the training forward after it gathers as much as one with no evaluation before it. At stage 3's
// default that is FSDP2's cost too (its evaluation forward unshards and reshards; its training
// forward unshards again). Where the evaluation keeps what it gathered (stages 1 and 2, stage 3
// with reshard_after_forward(false)) FSDP2 would reuse it, right when the evaluation came after the
// step and stale when before it; cpprun cannot tell the two apart and gathers anew (docs/fsdp.md).
TEST_CASE("fsdp: an evaluation forward after the step costs one all-gather; the next training forward one more",
          "[fsdp]") {
  auto sent = [] { return cpprun::detail::impl_of(group()).p2p_bytes_sent.load(); };
  for (int stage : {1, 2, 3}) {
    for (bool keep : {false, true}) {
      if (keep && stage != 3) continue;
      INFO("stage " << stage << (keep ? ", reshard_after_forward(false)" : ""));
      auto model = cpprun::FullyShardedDataParallel(std::make_shared<Mlp>(31), group(),
                                                    cpprun::FsdpOptions().stage(stage).wrap_policy(is_linear));
      if (keep) model->set_reshard_after_forward(false);
      torch::optim::SGD opt(model->parameters(), 0.1);
      auto forward = [&](torch::Tensor in) { return model->forward(in); };
      local_loss(forward, 0).backward();
      opt.step();
      uint64_t before = sent();
      auto loss = local_loss(forward, 1);
      const uint64_t training = sent() - before;  // no evaluation before it
      loss.backward();
      opt.step();
      before = sent();
      {
        torch::NoGradGuard no_grad;
        model->forward(inputs_for("mlp", kGlobalBatch, 90));
      }
      const uint64_t evaluation = sent() - before;
      before = sent();
      loss = local_loss(forward, 2);
      const uint64_t after_evaluation = sent() - before;
      loss.backward();
      CHECK(evaluation == training);
      CHECK(after_evaluation == training);
      if (group().size() > 1) CHECK(training > 0);  // alone nothing is gathered (Note [Nothing to shard alone])
    }
  }
}

// Note [Stage 1 reduce-scatters]: stage 1 keeps full gradients, but only this rank's rows of them
// are read after the reduction, so its backward sends what stage 2's does: each rank (W-1)/W of
// the padded gradients, once (an all-reduce sends twice that). Until 2026-12-06 stage 1
// all-reduced through Gloo's own collective, which sent nothing over the ring.
TEST_CASE("fsdp: stage 1's backward reduce-scatters: it sends what stage 2's sends", "[fsdp]") {
  auto sent = [] { return cpprun::detail::impl_of(group()).p2p_bytes_sent.load(); };
  const int world = group().size();
  auto probe = std::make_shared<Mlp>(31);
  const uint64_t expected = static_cast<uint64_t>(world - 1) * (padded_numel(*probe, world) / world) * sizeof(float);
  for (int stage : {1, 2}) {
    INFO("stage " << stage);
    auto model = cpprun::FullyShardedDataParallel(std::make_shared<Mlp>(31), group(),
                                                  cpprun::FsdpOptions().stage(stage).wrap_policy(is_linear));
    for (int step = 0; step < 2; ++step) {  // the second backward reduces into gradients the first left
      auto loss = local_loss([&](torch::Tensor in) { return model->forward(in); }, step);
      const uint64_t before = sent();
      loss.backward();
      CHECK(sent() - before == expected);
    }
  }
}

// Gradient accumulation as torchtitan and PyTorch's pipeline schedules do it: local backwards
// that keep the units gathered, so the next micro-batch's forward gathers nothing; the step's
// last backward synchronized and releasing (or keeping: the optimizer's step makes them stale,
// and the next forward gathers them anew, with no reshard() needed).
TEST_CASE("fsdp: set_reshard_after_backward(false) keeps the units for the next micro-batch; parity holds", "[fsdp]") {
  Float64Parity float64;
  const int world = group().size();
  const bool alone = world == 1;
  for (bool last_keeps : {false, true}) {
    INFO("the last backward keeps the units: " << last_keeps);
    torch::manual_seed(0);
    auto net = std::make_shared<Tower>();
    auto ref = std::make_shared<Tower>();
    copy_state(*ref, *net);
    auto model = cpprun::FullyShardedDataParallel(net, group(),
                                                  cpprun::FsdpOptions().stage(3).wrap_policy(is_block).gathered_unit_limit(8));
    const int64_t whole = 8 * padded_numel(*ref, world);
    torch::optim::SGD opt(model->parameters(), 0.1), ref_opt(ref->parameters(), 0.1);
    for (int step = 0; step < 3; ++step) {
      opt.zero_grad();
      ref_opt.zero_grad();
      for (int micro = 0; micro < 3; ++micro) {
        const bool last = micro == 2;
        const int64_t batch = 10 * step + micro;
        INFO("step " << step << " micro-batch " << micro);
        model->set_requires_gradient_sync(last);
        model->set_reshard_after_backward(last && !last_keeps);
        const int64_t started = model->prefetch_stats().started;
        auto loss = local_loss([&](torch::Tensor in) { return model->forward(in); }, batch);
        if (micro > 0) CHECK(model->prefetch_stats().started == started);  // all still gathered
        loss.backward();
        CHECK(model->memory().parameters == (!last || last_keeps || alone ? whole : 0));
        reference_backward([&](torch::Tensor in) { return ref->forward(in); }, inputs_for("mlp", kGlobalBatch, batch),
                           targets_for(kGlobalBatch, batch), world);
      }
      opt.step();
      ref_opt.step();
    }
    model->gather_full_parameters();
    check_same_parameters(*net, *ref, kParityTolerance);
  }
  // By default a local backward releases the units too, as FSDP2's (reshard_after_backward true).
  auto tower = std::make_shared<Tower>();
  const int64_t whole = 8 * padded_numel(*tower, world);
  auto model = cpprun::FullyShardedDataParallel(tower, group(),
                                                cpprun::FsdpOptions().stage(3).wrap_policy(is_block).gathered_unit_limit(8));
  model->set_requires_gradient_sync(false);
  local_loss([&](torch::Tensor in) { return model->forward(in); }, 0).backward();
  CHECK(model->memory().parameters == (alone ? whole : 0));
}

// A local backward may run twice through one graph (retain_graph): autograd's second pass gathers
// the units again for their saved weights, and must release them at its end as the first did, as
// FSDP2 reshards after each backward. Before 2026-12-05 the second pass queued no end of backward
// and its units stayed gathered (up to gathered_unit_limit) until the next forward.
TEST_CASE("fsdp: a second local backward through one graph (retain_graph) releases the units again", "[fsdp]") {
  Float64Parity float64;
  const int world = group().size();
  const bool alone = world == 1;
  torch::manual_seed(0);
  auto net = std::make_shared<Tower>();
  auto ref = std::make_shared<Tower>();
  copy_state(*ref, *net);
  const int64_t whole = 8 * padded_numel(*ref, world);
  auto model = cpprun::FullyShardedDataParallel(net, group(),
                                                cpprun::FsdpOptions().stage(3).wrap_policy(is_block).gathered_unit_limit(8));
  torch::optim::SGD opt(model->parameters(), 0.1), ref_opt(ref->parameters(), 0.1);
  model->set_requires_gradient_sync(false);
  auto loss = local_loss([&](torch::Tensor in) { return model->forward(in); }, 0);
  loss.backward({}, /*retain_graph=*/true);
  CHECK(model->memory().parameters == (alone ? whole : 0));
  const int64_t kept = model->memory().kept;
  loss.backward();
  CHECK(model->memory().parameters == (alone ? whole : 0));
  CHECK(model->memory().kept == kept);
  // The two passes' gradients accumulated, and a synchronized backward reduces their sum.
  for (int pass = 0; pass < 2; ++pass) {
    reference_backward([&](torch::Tensor in) { return ref->forward(in); }, inputs_for("mlp", kGlobalBatch, 0),
                       targets_for(kGlobalBatch, 0), world);
  }
  model->set_requires_gradient_sync(true);
  local_loss([&](torch::Tensor in) { return model->forward(in); }, 1).backward();
  CHECK(model->memory().parameters == (alone ? whole : 0));
  reference_backward([&](torch::Tensor in) { return ref->forward(in); }, inputs_for("mlp", kGlobalBatch, 1),
                     targets_for(kGlobalBatch, 1), world);
  opt.step();
  ref_opt.step();
  model->gather_full_parameters();
  check_same_parameters(*net, *ref, kParityTolerance);
}

namespace {

// Records the dtype its forward was given; computes in its weight's dtype.
struct DtypeProbeImpl : torch::nn::Module {
  DtypeProbeImpl() { linear = register_module("linear", torch::nn::Linear(4, 3)); }
  torch::Tensor forward(const torch::Tensor& x) {
    seen = x.scalar_type();
    return linear(x.to(linear->weight.scalar_type()));
  }
  torch::nn::Linear linear{nullptr};
  at::ScalarType seen = at::kByte;
};

}  // namespace

TEST_CASE("fsdp: MixedPrecisionPolicy's output_dtype and cast_forward_inputs, as FSDP2's", "[fsdp]") {
  for (int stage : {1, 2, 3}) {
    INFO("stage " << stage);
    const auto run = [&](cpprun::FsdpOptions options) {
      auto probe = std::make_shared<DtypeProbeImpl>();
      auto model = cpprun::FullyShardedDataParallel(probe, group(), options.stage(stage).param_dtype(at::kBFloat16));
      const torch::Tensor out = model->forward(torch::ones({2, 4}));
      out.sum().backward();  // gradients flow through the cast
      bool grads = true;
      for (const auto& p : model->parameters()) grads = grads && p.grad().defined() && p.grad().dtype() == at::kFloat;
      CHECK(grads);
      return std::pair{probe->seen, out.scalar_type()};
    };
    // The default: inputs cast to param_dtype, outputs as the module computed them.
    CHECK(run(cpprun::FsdpOptions()) == std::pair{at::kBFloat16, at::kBFloat16});
    // output_dtype: bf16 logits handed on in fp32.
    CHECK(run(cpprun::FsdpOptions().output_dtype(at::kFloat)) == std::pair{at::kBFloat16, at::kFloat});
    // cast_forward_inputs(false): the module gets its inputs as they come.
    CHECK(run(cpprun::FsdpOptions().cast_forward_inputs(false)) == std::pair{at::kFloat, at::kBFloat16});
  }
  const auto refused = [] {
    return cpprun::FullyShardedDataParallel(std::make_shared<DtypeProbeImpl>(), group(),
                                            cpprun::FsdpOptions().output_dtype(at::kLong));
  };
  CHECK_THROWS_WITH(refused(), Catch::Matchers::Contains("output_dtype must be a floating-point dtype"));
  CHECK_THROWS_WITH(cpprun::FullyShardedDataParallel(std::make_shared<DtypeProbeImpl>(), group(),
                                                     cpprun::FsdpOptions().param_dtype(at::kLong)),
                    Catch::Matchers::Contains("param_dtype must be a floating-point dtype"));
  CHECK_THROWS_WITH(cpprun::FullyShardedDataParallel(std::make_shared<DtypeProbeImpl>(), group(),
                                                     cpprun::FsdpOptions().reduce_dtype(at::kInt)),
                    Catch::Matchers::Contains("reduce_dtype must be a floating-point dtype"));
}

// A LoRA-style fine-tune: the base weights frozen, the rest trained. FSDP kept frozen parameters
// out of its units, whole on every rank and uncast under param_dtype; they are sharded, gathered
// and cast as the others now (as FSDP2's), and only never reduced (Note [A parameter unfrozen
// after wrapping] in fsdp_core.cpp).
TEST_CASE("fsdp: frozen parameters are sharded and gathered like the others, never reduced; parity holds", "[fsdp]") {
  Float64Parity float64;
  const int rank = group().rank(), world = group().size();
  const std::vector<std::string> base = {"in.weight", "b0.mix.weight", "b1.mix.weight", "b2.mix.weight"};
  const auto freeze = [&](torch::nn::Module& m) {
    for (auto& p : m.named_parameters()) {
      if (std::find(base.begin(), base.end(), p.key()) != base.end()) p.value().requires_grad_(false);
    }
  };
  for (int stage : {1, 2, 3}) {
    INFO("stage " << stage);
    torch::manual_seed(0);
    auto net = std::make_shared<Tower>();
    auto ref = std::make_shared<Tower>();
    copy_state(*ref, *net);
    freeze(*net);
    freeze(*ref);
    std::map<std::string, torch::Tensor> initial;
    for (const auto& name : base) initial[name] = net->named_parameters()[name].detach().clone();
    auto model =
        cpprun::FullyShardedDataParallel(net, group(), cpprun::FsdpOptions().stage(stage).wrap_policy(is_block));
    // Each rank holds its rows of a frozen weight (13 rows: C = ceil(13 / W)), as of a trained one.
    auto shards = model->named_parameters();
    const int64_t per_rank = (13 + world - 1) / world;
    for (const auto& name : base) {
      INFO(name);
      CHECK(shards[name].size(0) == std::max<int64_t>(0, std::min<int64_t>(per_rank, 13 - rank * per_rank)));
      CHECK_FALSE(shards[name].requires_grad());
    }
    const auto sgd = torch::optim::SGDOptions(0.1).momentum(0.9);
    torch::optim::SGD opt(model->parameters(), sgd), ref_opt(ref->parameters(), sgd);
    for (int step = 0; step < 3; ++step) {
      opt.zero_grad();
      ref_opt.zero_grad();
      local_loss([&](torch::Tensor in) { return model->forward(in); }, step).backward();
      reference_backward([&](torch::Tensor in) { return ref->forward(in); }, inputs_for("mlp", kGlobalBatch, step),
                         targets_for(kGlobalBatch, step), world);
      for (const auto& name : base) {
        INFO(name << ", step " << step);
        CHECK_FALSE(shards[name].grad().defined());  // nothing reduced for it
        CHECK_FALSE(net->named_parameters()[name].grad().defined());
      }
      // Stage 3: a frozen weight goes with its unit, as a trained one does.
      if (stage == 3 && world > 1) CHECK(net->b0->mix->weight.storage().nbytes() == 0);
      opt.step();
      ref_opt.step();
    }
    model->gather_full_parameters();
    check_same_parameters(*net, *ref, kParityTolerance);
    for (const auto& name : base) CHECK(torch::equal(net->named_parameters()[name], initial[name]));
    // A frozen shard written on one rank after a step (an EMA teacher's update, under `if (rank ==
    // 0)`) reaches every rank's full weight: the ranks agree to gather it. At stages 1 and 2 only
    // the rank that wrote it gathered, and the job aborted on the mismatch.
    {
      torch::NoGradGuard no_grad;
      if (rank == 0) shards["b1.mix.weight"].add_(1.0);
    }
    {
      torch::NoGradGuard no_grad;
      model->forward(inputs_for("mlp", kGlobalBatch, 0));
    }
    model->gather_full_parameters();
    torch::Tensor expected = initial["b1.mix.weight"].clone();
    expected.narrow(0, 0, per_rank).add_(1.0);
    CHECK(torch::equal(net->b1->mix->weight, expected));
  }
}

namespace {

// A LoRA block: a frozen base weight and a trainable low-rank update, y = x W^T + (x A^T) B^T.
// Made in either order, the same arithmetic; backward runs the later-made branch first.
struct LoraBlock : torch::nn::Module {
  torch::Tensor w, a, b;
  bool adapter_first = false;
  LoraBlock(int64_t d, int64_t r, bool adapter_first_) : adapter_first(adapter_first_) {
    w = register_parameter("w", torch::randn({d, d}) / std::sqrt(static_cast<double>(d)), /*requires_grad=*/false);
    a = register_parameter("a", torch::randn({r, d}) * 0.1);
    b = register_parameter("b", torch::randn({d, r}) * 0.1);
  }
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor update, base;
    if (adapter_first) update = torch::mm(torch::mm(x, a.t()), b.t());
    base = torch::mm(x, w.t());
    if (!adapter_first) update = torch::mm(torch::mm(x, a.t()), b.t());
    return x + torch::tanh(base + update);
  }
};
bool is_lora_block(const torch::nn::Module& m) { return dynamic_cast<const LoraBlock*>(&m) != nullptr; }

}  // namespace

// Stage 3: a unit whose trainable parameters' gradients are all in may still be needed for its
// frozen ones' input gradient (standard LoRA makes the adapter after the base, so backward is
// through the adapter first). It was released then, and gathered again at once: 3 units' more
// all-gathers a step than the same model made the other way round (an audit, 2026-12-07).
TEST_CASE("fsdp: stage 3 keeps a unit with frozen weights until backward is through them", "[fsdp]") {
  Float64Parity float64;
  const int rank = group().rank(), world = group().size();
  std::vector<int64_t> backward_bytes;
  for (bool adapter_first : {false, true}) {
    torch::manual_seed(0);
    torch::nn::Sequential net;
    for (int i = 0; i < 4; ++i) net->push_back(std::make_shared<LoraBlock>(32, 4, adapter_first));
    auto model =
        cpprun::FullyShardedDataParallel(net.ptr(), group(), cpprun::FsdpOptions().stage(3).wrap_policy(is_lora_block));
    const auto x = slice(torch::randn({8, 32}), rank, world);
    auto loss = model->forward(x).pow(2).sum();
    const int64_t before = cpprun::detail::impl_of(group()).p2p_bytes_sent.load();
    loss.backward();
    backward_bytes.push_back(cpprun::detail::impl_of(group()).p2p_bytes_sent.load() - before);
  }
  INFO("backward bytes sent, the adapter made after the base: " << backward_bytes[0] << ", before it: "
                                                                << backward_bytes[1]);
  CHECK(backward_bytes[0] == backward_bytes[1]);
  if (world > 1) CHECK(backward_bytes[0] > 0);  // backward gathers: the comparison compares something
}

// A LoRA block's frozen base weight and trainable adapters (one dtype) are gathered by one
// all-gather, as FSDP2 gathers a parameter group whatever its requires_grad: they were two
// buckets and two all-gathers per gather, so a frozen model made twice the collectives of the same
// model trained whole. What is gathered is checked by the frozen parity tests.
TEST_CASE("fsdp: a unit's frozen and trainable parameters of one dtype are gathered by one all-gather",
          "[fsdp]") {
  Float64Parity float64;
  const int rank = group().rank(), world = group().size();
  if (world == 1) return;  // alone in the shard group nothing is gathered (np2-np4 run it)
  // The group's all-gathers since its last barrier, from the flight recorder (a ring of the last
  // entries: counted by the group's collective numbers, not by how many entries it holds).
  const auto all_gathers_since_barrier = [] {
    const auto entries = cpprun::flight_recorder_entries();
    const auto barrier = std::find_if(entries.rbegin(), entries.rend(), [](const auto& e) { return e.op == "barrier"; });
    REQUIRE(barrier != entries.rend());
    return std::count_if(entries.begin(), entries.end(), [&](const auto& e) {
      return e.op == "all_gather_into" && e.group == barrier->group && e.seq > barrier->seq;
    });
  };
  std::vector<int64_t> counts;  // a step's all-gathers, the base frozen, then trained too
  for (bool frozen : {true, false}) {
    torch::manual_seed(0);
    torch::nn::Sequential net;
    for (int i = 0; i < 4; ++i) {
      auto block = std::make_shared<LoraBlock>(32, 4, /*adapter_first=*/false);
      block->w.requires_grad_(!frozen);
      net->push_back(block);
    }
    auto model =
        cpprun::FullyShardedDataParallel(net.ptr(), group(), cpprun::FsdpOptions().stage(3).wrap_policy(is_lora_block));
    const auto x = slice(torch::randn({8, 32}), rank, world);
    cpprun::barrier(group());
    model->forward(x).pow(2).sum().backward();
    counts.push_back(all_gathers_since_barrier());
  }
  INFO("all-gathers in a step, the base weights frozen: " << counts[0] << ", trained: " << counts[1]);
  CHECK(counts[0] == counts[1]);
  CHECK(counts[0] >= 4);  // at least each unit's forward gather: the count counts something
}

// Under param_dtype a frozen weight computes in it too (the forward failed with ATen's bare "must
// have the same dtype" when frozen parameters stayed out of the units); a frozen integer parameter
// is sharded and gathered as it is.
TEST_CASE("fsdp: frozen parameters compute in param_dtype; a frozen integer one stays as it is", "[fsdp]") {
  Float64Parity float64;
  const int rank = group().rank(), world = group().size();
  for (int stage : {1, 3}) {
    INFO("stage " << stage);
    torch::manual_seed(0);
    auto net = std::make_shared<Tower>();
    net->in->weight.requires_grad_(false);
    net->register_parameter("ids", torch::arange(5, torch::kLong), /*requires_grad=*/false);
    auto model = cpprun::FullyShardedDataParallel(
        net, group(), cpprun::FsdpOptions().stage(stage).wrap_policy(is_block).param_dtype(at::kFloat));
    torch::optim::SGD opt(model->parameters(), 0.1);
    torch::Tensor loss;
    CHECK_NOTHROW(loss = local_loss([&](torch::Tensor in) { return model->forward(in); }, 0));
    CHECK(loss.scalar_type() == at::kFloat);
    loss.backward();
    opt.step();
    auto shards = model->named_parameters();
    CHECK(shards["in.weight"].scalar_type() == at::kDouble);  // the shard keeps the parameter's dtype
    const int64_t per_rank = (5 + world - 1) / world;
    const int64_t first = std::min<int64_t>(5, rank * per_rank);
    CHECK(torch::equal(shards["ids"], torch::arange(first, std::min<int64_t>(5, first + per_rank), torch::kLong)));
    model->gather_full_parameters();
    CHECK(torch::equal(net->named_parameters()["ids"], torch::arange(5, torch::kLong)));
  }
}

namespace {

// A seeded Mlp under FSDP at `stage`, a unit per Linear, over the whole group or (given) the
// {replicate, shard} mesh, and a reference copy of it that one process trains.
struct FsdpWithReference {
  std::shared_ptr<Mlp> net;
  cpprun::FullyShardedDataParallel<Mlp> model;
  std::shared_ptr<Mlp> ref;
};
FsdpWithReference fsdp_with_reference(int stage, const cpprun::DeviceMesh* mesh) {
  torch::manual_seed(0);
  auto net = std::make_shared<Mlp>(31);
  auto ref = std::make_shared<Mlp>(31);
  copy_state(*ref, *net);
  const auto options = cpprun::FsdpOptions().stage(stage).wrap_policy(is_linear);
  auto model = mesh ? cpprun::FullyShardedDataParallel(net, *mesh, options)
                    : cpprun::FullyShardedDataParallel(net, group(), options);
  return {net, std::move(model), ref};
}

}  // namespace

// FSDP2's set_gradient_divide_factor(f): the synchronized gradient is the sum of the ranks' over f
// (their average times world / f), at every stage, alone (np1), in float64 (FSDP2's two divisions:
// by 2 before the reduction and 1.5 after it at f = 3) and float32 (its PREMUL_SUM, here a
// multiplication by 1/3 before it), with set_force_sum_reduction_for_comms, and under HSDP (2 x 1:
// a shard group of one, where PyTorch 2.15 divides twice; 2 x 2 at 4 ranks). Checked against one
// process whose loss is scaled by world / f; the bits against PyTorch's in
// dist.fsdp.controls_match_pytorch.
TEST_CASE("fsdp: set_gradient_divide_factor divides the sum of the ranks' gradients, as FSDP2's", "[fsdp]") {
  Float64Parity float64;  // puts back the default dtype, which the loop changes
  const int world = group().size();
  std::optional<cpprun::DeviceMesh> mesh;
  if (world % 2 == 0) mesh.emplace(group(), std::vector<int>{2, world / 2}, std::vector<std::string>{"replicate", "shard"});
  for (auto dtype : {at::kDouble, at::kFloat}) {
    const double tolerance = dtype == at::kDouble ? kParityTolerance : 1e-5;
    torch::set_default_dtype(caffe2::TypeMeta::fromScalarType(dtype));
    for (int stage : {1, 2, 3}) {
      for (bool force_sum : {false, true}) {
        for (bool hsdp : {false, true}) {
          if (hsdp && !mesh) continue;
          INFO("dtype " << dtype << " stage " << stage << " force_sum " << force_sum << " hsdp " << hsdp);
          auto made = fsdp_with_reference(stage, hsdp ? &*mesh : nullptr);
          auto &net = made.net, &ref = made.ref;
          auto& model = made.model;
          model->set_gradient_divide_factor(3.0);
          model->set_force_sum_reduction_for_comms(force_sum);
          torch::optim::SGD opt(model->parameters(), 0.1), ref_opt(ref->parameters(), 0.1);
          for (int step = 0; step < 2; ++step) {
            opt.zero_grad();
            ref_opt.zero_grad();
            local_loss([&](torch::Tensor in) { return model->forward(in).to(dtype); }, step).backward();
            reference_backward([&](torch::Tensor in) { return ref->forward(in.to(dtype)); },
                               inputs_for("mlp", kGlobalBatch, step), targets_for(kGlobalBatch, step), world,
                               [&](torch::Tensor loss) { return loss * world / 3.0; });
            opt.step();
            ref_opt.step();
          }
          model->gather_full_parameters();
          check_same_parameters(*net, *ref, tolerance);
        }
      }
    }
  }
  auto model = cpprun::FullyShardedDataParallel(std::make_shared<Mlp>(31), group());
  for (double bad : {0.0, -2.0, std::nan("")}) {
    CHECK_THROWS_WITH(model->set_gradient_divide_factor(bad), Catch::Contains("must be a positive finite number"));
  }
}

// FSDP2's set_all_reduce_hook: called once per unit (bucket) in each synchronized backward with
// this rank's reduced rows, none in local backwards nor where HSDP's all-reduce is off; what it
// does to them is what the shards' gradients get. Here it doubles them: one process with each
// loss doubled must match, at stages 1-3, alone (np1: a reduce-scatter in the group of one makes
// the rows), and under HSDP (2 x 1 and 2 x 2). Its place between the reduction and the division
// after it is checked against PyTorch in dist.fsdp.controls_match_pytorch.
TEST_CASE("fsdp: set_all_reduce_hook sees each unit's reduced rows once per synchronized backward", "[fsdp]") {
  Float64Parity float64;
  const int world = group().size();
  std::optional<cpprun::DeviceMesh> mesh;
  if (world % 2 == 0) mesh.emplace(group(), std::vector<int>{2, world / 2}, std::vector<std::string>{"replicate", "shard"});
  for (int stage : {1, 2, 3}) {
    for (bool hsdp : {false, true}) {
      if (hsdp && !mesh) continue;
      INFO("stage " << stage << " hsdp " << hsdp);
      auto made = fsdp_with_reference(stage, hsdp ? &*mesh : nullptr);
      auto &net = made.net, &ref = made.ref;
      auto& model = made.model;
      int calls = 0;
      model->set_all_reduce_hook([&calls](const torch::Tensor& rows) {
        ++calls;
        CHECK(rows.dim() == 1);
        CHECK(rows.scalar_type() == at::kDouble);
        rows.mul_(2);
      });
      const int units = static_cast<int>(model->bucket_count());
      torch::optim::SGD opt(model->parameters(), 0.1), ref_opt(ref->parameters(), 0.1);
      auto micro_batch = [&](int64_t batch) {
        local_loss([&](torch::Tensor in) { return model->forward(in); }, batch).backward();
        reference_backward([&](torch::Tensor in) { return ref->forward(in); }, inputs_for("mlp", kGlobalBatch, batch),
                           targets_for(kGlobalBatch, batch), world, [](torch::Tensor loss) { return loss * 2; });
      };
      for (int step = 0; step < 2; ++step) {
        opt.zero_grad();
        ref_opt.zero_grad();
        model->set_requires_gradient_sync(false);
        micro_batch(10 * step);
        CHECK(calls == 0);
        model->set_requires_gradient_sync(true);
        if (hsdp) {
          model->set_requires_all_reduce(false);
          micro_batch(10 * step + 1);
          CHECK(calls == 0);
          model->set_requires_all_reduce(true);
        }
        micro_batch(10 * step + 2);
        CHECK(calls == units);
        calls = 0;
        opt.step();
        ref_opt.step();
      }
      model->gather_full_parameters();
      check_same_parameters(*net, *ref, kParityTolerance);
    }
  }
}
