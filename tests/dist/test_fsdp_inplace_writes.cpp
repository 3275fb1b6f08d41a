// In-place writes after wrapping (docs/fsdp.md, "In-place writes after wrapping"): a user's
// initialisation of the wrapped module's full parameters, or of the shards, must be what training
// starts from, at every stage, under HSDP and with cpu_offload; under mixed precision a write to the
// compute copy is refused, naming the parameter. Each rank trains beside one process that wrote
// the same values into an unwrapped copy before training, in float64 (Note [Parity in float64] in
// parity_checks.h). Hidden 31: rows that divide by neither 2 nor 3 ranks. CHECK, not REQUIRE,
// keeps every rank's collectives in step.
#include "catch.h"
#include <torch/torch.h>

#include <functional>
#include <string>
#include <vector>

#include "cpprun/cpprun.h"
#include "ddp_test_models.h"
#include "dist_test_support.h"
#include "parity_checks.h"
#include "parity_training.h"

using namespace ddp_test;

namespace {

using dist_test::group;
using dist_test::slice;

constexpr int64_t kBatch = 24;
constexpr int64_t kHidden = 31;
using Fsdp = cpprun::FullyShardedDataParallel<Mlp>;

// This rank's rows of `full` within a shard group of `world` ranks, as FSDP shards it.
torch::Tensor own_rows(const torch::Tensor& full, int rank, int world) {
  const int64_t per_rank = (full.size(0) + world - 1) / world;
  const int64_t first = std::min<int64_t>(rank * per_rank, full.size(0));
  return full.narrow(0, first, std::min<int64_t>(per_rank, full.size(0) - first));
}

// What a port of an init_weights writes after wrapping: normal_ from a generator seeded alike on
// every rank, fill_, copy_ from a reference tensor, a write through .data(), one row of a weight
// (a view), zero_. Every parameter is written; fc3.weight only in part.
void initialise(Mlp& net) {
  torch::NoGradGuard no_grad;
  auto generator = at::make_generator<at::CPUGeneratorImpl>(1234);
  net.fc1->weight.normal_(0, 0.5, generator);
  net.fc1->bias.fill_(0.25);
  net.fc2->weight.copy_(torch::linspace(-0.4, 0.4, net.fc2->weight.numel()).view_as(net.fc2->weight));
  net.fc2->bias.data().uniform_(-0.3, 0.3, generator);
  net.fc3->weight[1].mul_(3);
  net.fc3->bias.zero_();
}

// torchtitan's shape: one loop over every parameter.
void initialise_each(Mlp& net) {
  torch::NoGradGuard no_grad;
  auto generator = at::make_generator<at::CPUGeneratorImpl>(99);
  for (auto& p : net.parameters()) p.normal_(0, 0.2, generator);
}

// Between steps: one layer re-initialised, in part.
void reinitialise(Mlp& net) {
  torch::NoGradGuard no_grad;
  net.fc3->weight.narrow(0, 1, 2).fill_(0.1);
  net.fc2->bias.copy_(torch::linspace(-0.2, 0.2, kHidden));
}

struct Case {
  std::string name;
  std::function<Fsdp(const std::shared_ptr<Mlp>&)> wrap;
  int shard_world;  // the ranks a parameter's rows are cut across
};

std::vector<Case> cases() {
  const int world = group().size();
  std::vector<Case> out;
  for (int stage : {1, 2, 3}) {
    const auto options = cpprun::FsdpOptions().stage(stage).wrap_policy(is_linear);
    out.push_back({"stage " + std::to_string(stage),
                   [options](const std::shared_ptr<Mlp>& net) { return cpprun::FullyShardedDataParallel(net, group(), options); },
                   world});
  }
  const auto stage3 = cpprun::FsdpOptions().stage(3).wrap_policy(is_linear);
  out.push_back({"stage 3, cpu_offload", [stage3](const std::shared_ptr<Mlp>& net) {
                   return cpprun::FullyShardedDataParallel(net, group(), cpprun::FsdpOptions(stage3).cpu_offload(true));
                 }, world});
  out.push_back({"stage 3, one unit gathered at a time", [stage3](const std::shared_ptr<Mlp>& net) {
                   return cpprun::FullyShardedDataParallel(net, group(), cpprun::FsdpOptions(stage3).gathered_unit_limit(1));
                 }, world});
  // HSDP: 2 replicas x 2 shards at 4 ranks; elsewhere every rank a replica of whole shards.
  static const cpprun::DeviceMesh mesh(group(), world == 4 ? std::vector<int>{2, 2} : std::vector<int>{world, 1},
                                       std::vector<std::string>{"replicate", "shard"});
  for (int stage : {2, 3}) {
    out.push_back({"HSDP stage " + std::to_string(stage), [stage](const std::shared_ptr<Mlp>& net) {
                     return cpprun::FullyShardedDataParallel(net, mesh, cpprun::FsdpOptions().stage(stage).wrap_policy(is_linear));
                   }, mesh.size(1)});
  }
  return out;
}

// One SGD-momentum step of the model on this rank's slice and of the reference on the whole batch.
void step_both(Fsdp& model, torch::optim::Optimizer& opt, Mlp& ref,
               torch::optim::Optimizer& ref_opt, int step) {
  const int rank = group().rank(), world = group().size();
  auto x = inputs_for("mlp", kBatch, step);
  auto y = targets_for(kBatch, step);
  opt.zero_grad();
  torch::nn::functional::cross_entropy(model->forward(slice(x, rank, world)), slice(y, rank, world)).backward();
  opt.step();
  ref_opt.zero_grad();
  reference_backward([&](torch::Tensor in) { return ref.forward(in); }, x, y, world);
  ref_opt.step();
}

// `write` runs on the wrapped module's full parameters after wrapping and on the reference before
// training; again (`rewrite`) between steps 2 and 3.
void check_writes_train(const Case& c, const std::function<void(Mlp&)>& write,
                        const std::function<void(Mlp&)>& rewrite) {
  Float64Parity float64;
  INFO(c.name);
  torch::manual_seed(7);  // the same initial values on every rank, and in the reference
  auto net = std::make_shared<Mlp>(kHidden);
  auto ref = std::make_shared<Mlp>(kHidden);
  copy_state(*ref, *net);
  auto model = c.wrap(net);
  write(*net);
  write(*ref);
  // Each shard holds its rows of what was written, before any forward.
  auto ref_params = ref->named_parameters();
  const int shard_rank = group().rank() % c.shard_world;
  for (const auto& item : model->named_parameters()) {
    INFO("shard of " << item.key());
    CHECK(torch::equal(item.value(), own_rows(ref_params[item.key()], shard_rank, c.shard_world)));
  }
  auto opt = make_optimizer("sgd", model->parameters());
  auto ref_opt = make_optimizer("sgd", ref->parameters());
  for (int step = 0; step < 4; ++step) {
    if (step == 2 && rewrite) {
      rewrite(*net);
      rewrite(*ref);
    }
    step_both(model, *opt, *ref, *ref_opt, step);
  }
  model->gather_full_parameters();
  check_same_parameters(*net, *ref, kParityTolerance);
}

}  // namespace

TEST_CASE("fsdp: in-place writes to the full parameters after wrapping are what training starts from", "[fsdp]") {
  for (const Case& c : cases()) {
    check_writes_train(c, initialise, reinitialise);
    check_writes_train(c, initialise_each, nullptr);
  }
}

TEST_CASE("fsdp: in-place writes to the shards reach the full parameters at the next forward", "[fsdp]") {
  // The remedy the mixed-precision refusal names: each rank writes its rows into the shards.
  for (const Case& c : cases()) {
    const int shard_rank = group().rank() % c.shard_world;
    auto write_shards = [&](Fsdp& model, const Mlp& written) {
      torch::NoGradGuard no_grad;
      auto values = written.named_parameters();
      for (auto& item : model->named_parameters()) {
        item.value().copy_(own_rows(values[item.key()], shard_rank, c.shard_world));
      }
    };
    Float64Parity float64;
    INFO(c.name);
    torch::manual_seed(7);
    auto net = std::make_shared<Mlp>(kHidden);
    auto ref = std::make_shared<Mlp>(kHidden);
    copy_state(*ref, *net);
    auto model = c.wrap(net);
    initialise(*ref);
    write_shards(model, *ref);
    auto opt = make_optimizer("sgd", model->parameters());
    auto ref_opt = make_optimizer("sgd", ref->parameters());
    for (int step = 0; step < 3; ++step) step_both(model, *opt, *ref, *ref_opt, step);
    model->gather_full_parameters();
    check_same_parameters(*net, *ref, kParityTolerance);
  }
}

TEST_CASE("fsdp: a shard written on one rank only is gathered by every rank at the next forward", "[fsdp]") {
  // The rows of the shard group's first rank written there alone, between two evaluation forwards
  // (no step between: only the version counters tell). Each rank sees its own counters only; the
  // ranks must agree to gather, or those that saw the write all-gather alone and every later
  // collective pairs wrongly (Note [Shard writes seen on one rank] in fsdp_collectives.cpp).
  const int rank = group().rank(), world = group().size();
  for (Case c : cases()) {
    if (c.name.find("stage 3") != std::string::npos) {  // units kept gathered between forwards
      const auto wrap = c.wrap;
      c.wrap = [wrap](const std::shared_ptr<Mlp>& net) {
        auto model = wrap(net);
        model->set_reshard_after_forward(false);
        return model;
      };
      c.name += ", reshard_after_forward off";
    }
    Float64Parity float64;
    INFO(c.name);
    const int shard_rank = rank % c.shard_world;
    torch::manual_seed(7);
    auto net = std::make_shared<Mlp>(kHidden);
    auto model = c.wrap(net);
    const auto x = slice(inputs_for("mlp", kBatch, 0), rank, world);
    torch::NoGradGuard no_grad;
    model->forward(x);
    model->gather_full_parameters();
    torch::Tensor expected = net->fc2->weight.clone();
    own_rows(expected, 0, c.shard_world).fill_(0.5);
    if (shard_rank == 0) model->named_parameters()["fc2.weight"].fill_(0.5);
    const auto out = model->forward(x);
    model->gather_full_parameters();
    CHECK(torch::equal(net->fc2->weight, expected));
    // The ranks are still in step: an all-reduce pairs with an all-reduce.
    auto ones = torch::ones({3}, torch::kDouble);
    cpprun::all_reduce(group(), ones);
    CHECK(torch::equal(ones, torch::full({3}, static_cast<double>(world), torch::kDouble)));
    CHECK(out.size(0) == x.size(0));
  }
}

TEST_CASE("fsdp: under mixed precision an in-place write to a full parameter is refused, naming it", "[fsdp]") {
  const int rank = group().rank(), world = group().size();
  for (int stage : {1, 2, 3}) {
    INFO("stage " << stage);
    torch::manual_seed(7);
    auto net = std::make_shared<Mlp>(kHidden);
    auto model = cpprun::FullyShardedDataParallel(
        net, group(), cpprun::FsdpOptions().stage(stage).wrap_policy(is_linear).param_dtype(at::kBFloat16));
    auto x = inputs_for("mlp", kBatch, 0).to(torch::kFloat);
    // Catch's matchers hold their parts by address: each CHECK builds its own.
#define REFUSAL                                                                           \
  (Catch::Contains("\"fc1.weight\"") && Catch::Contains("BFloat16 compute copy") && \
   Catch::Contains("Initialise the module before wrapping it"))
    torch::NoGradGuard no_grad;
    if (stage == 3) {  // on the write itself, through .data() too
      CHECK_THROWS_WITH(net->fc1->weight.fill_(1), REFUSAL && Catch::Contains("aten::fill_"));
      CHECK_THROWS_WITH(net->fc1->weight.data().normal_(), REFUSAL);
    } else {  // at the next forward (or gather), by the version counter
      net->fc1->weight.fill_(1);
      CHECK_THROWS_WITH(model->forward(slice(x, rank, world)), REFUSAL);
      CHECK_THROWS_WITH(model->gather_full_parameters(), REFUSAL);
    }
#undef REFUSAL
  }
  // The shards (fp32 masters) written instead reach the bf16 compute copies.
  for (int stage : {1, 2, 3}) {
    INFO("stage " << stage << ", shards written");
    torch::manual_seed(7);
    auto net = std::make_shared<Mlp>(kHidden);
    auto model = cpprun::FullyShardedDataParallel(
        net, group(), cpprun::FsdpOptions().stage(stage).wrap_policy(is_linear).param_dtype(at::kBFloat16));
    const auto written = torch::linspace(-1, 1, net->fc2->weight.numel()).view_as(net->fc2->weight);
    {
      torch::NoGradGuard no_grad;
      model->named_parameters()["fc2.weight"].copy_(own_rows(written, rank, world));
    }
    model->gather_full_parameters();
    CHECK(torch::equal(net->fc2->weight, written.to(torch::kBFloat16)));
  }
}
