// SyncBatchNorm under `cpprun --nproc_per_node=K`, K = 1..4: DDP training of models whose
// BatchNorm{1,2}d were converted equals one process training plain BatchNorm on the global
// batch (parameters and running statistics, float64), and conversion keeps the tensors.
#include "catch.h"
#include <torch/torch.h>

#include "cpprun/cpprun.h"
#include "cpprun/sync_batch_norm.h"
#include "dist_test_support.h"
#include "ddp_test_models.h"
#include "parity_checks.h"

using dist_test::group;
using dist_test::slice;

namespace {

constexpr int64_t kGlobalBatch = 12;  // divides by 1, 2, 3 and 4 ranks

torch::nn::Sequential make_cnn() {
  return torch::nn::Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 4, 3).padding(1).bias(false)),
                               torch::nn::BatchNorm2d(4), torch::nn::ReLU(),
                               torch::nn::Conv2d(torch::nn::Conv2dOptions(4, 6, 3).padding(1).bias(false)),
                               torch::nn::BatchNorm2d(torch::nn::BatchNormOptions(6).momentum(0.3)),
                               torch::nn::Flatten(), torch::nn::Linear(6 * 8 * 8, 4));
}

torch::nn::Sequential make_mlp() {
  return torch::nn::Sequential(torch::nn::Linear(10, 16), torch::nn::BatchNorm1d(16), torch::nn::Tanh(),
                               torch::nn::Linear(16, 4));
}

torch::Tensor inputs(const std::string& model, int64_t step) {
  torch::manual_seed(500 + step);
  return model == "cnn" ? torch::randn({kGlobalBatch, 1, 8, 8}) * 2 + 1 : torch::randn({kGlobalBatch, 10}) * 3;
}

// given_group false: the layers and DDP are given no group and take the default one (group()).
void check_training_matches(const std::string& model, bool given_group = true) {
  const int rank = group().rank(), world = group().size();
  ddp_test::Float64Parity float64;  // See Note [Parity in float64]
  torch::manual_seed(7);  // the same initial weights everywhere
  torch::nn::Sequential net = model == "cnn" ? make_cnn() : make_mlp();
  torch::nn::Sequential ref = model == "cnn" ? make_cnn() : make_mlp();
  ddp_test::copy_state(*ref, *net);
  auto converted = given_group ? cpprun::convert_sync_batchnorm(net.ptr(), group())
                               : cpprun::convert_sync_batchnorm(net.ptr());
  CHECK(converted == net.ptr());
  int synced = 0;
  for (const auto& m : net->modules()) synced += dynamic_cast<cpprun::SyncBatchNormImpl*>(m.get()) != nullptr;
  CHECK(synced == (model == "cnn" ? 2 : 1));

  auto ddp = given_group ? cpprun::DistributedDataParallel(net, group()) : cpprun::DistributedDataParallel(net);
  CHECK(ddp->process_group().size() == world);
  torch::optim::SGD opt(ddp->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::optim::SGD ref_opt(ref->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int64_t step = 0; step < 4; ++step) {
    auto x = inputs(model, step);
    auto y = ddp_test::targets_for(kGlobalBatch, step);
    opt.zero_grad();
    torch::nn::functional::cross_entropy(ddp->forward(slice(x, rank, world)), slice(y, rank, world)).backward();
    opt.step();
    ref_opt.zero_grad();
    torch::nn::functional::cross_entropy(ref->forward(x), y).backward();
    ref_opt.step();
  }
  auto ref_params = ref->named_parameters();
  for (const auto& item : net->named_parameters()) {
    const double diff = ddp_test::relative_difference(item.value(), ref_params[item.key()]);
    INFO(model << " parameter " << item.key() << " relative difference " << diff);
    CHECK(diff <= ddp_test::kParityTolerance);
  }
  auto ref_buffers = ref->named_buffers();
  for (const auto& item : net->named_buffers()) {
    const double diff = ddp_test::relative_difference(item.value(), ref_buffers[item.key()]);
    INFO(model << " buffer " << item.key() << " relative difference " << diff);
    CHECK(diff <= ddp_test::kParityTolerance);
  }
  // Eval mode uses the running statistics, as BatchNorm does.
  net->eval();
  ref->eval();
  auto x = inputs(model, 99);
  torch::NoGradGuard no_grad;
  CHECK(ddp_test::relative_difference(net->forward(x), ref->forward(x)) <= ddp_test::kParityTolerance);
}

}  // namespace

TEST_CASE("sync batch norm: DDP with SyncBatchNorm2d trains as one process with BatchNorm2d", "[syncbn]") {
  check_training_matches("cnn");
}

TEST_CASE("sync batch norm: DDP with SyncBatchNorm1d trains as one process with BatchNorm1d", "[syncbn]") {
  check_training_matches("mlp");
}

// As torch.nn.SyncBatchNorm(process_group=None), convert_sync_batchnorm(module) and DDP(module).
TEST_CASE("sync batch norm: given no group, the layers and DDP sync over the default group", "[syncbn]") {
  check_training_matches("mlp", /*given_group=*/false);
  CHECK_FALSE(cpprun::SyncBatchNorm(4)->process_group().has_value());
  CHECK(cpprun::SyncBatchNorm(4, group())->process_group()->size() == group().size());
}

TEST_CASE("sync batch norm: conversion shares the tensors; the layer checks its input", "[syncbn]") {
  torch::nn::BatchNorm2d bn(torch::nn::BatchNormOptions(3).eps(1e-3));
  {
    torch::NoGradGuard no_grad;
    bn->weight.fill_(2);
    bn->running_mean.fill_(0.5);
  }
  auto converted = cpprun::convert_sync_batchnorm(bn.ptr(), group());
  auto sync = std::dynamic_pointer_cast<cpprun::SyncBatchNormImpl>(converted);
  REQUIRE(sync);
  CHECK(sync->weight.is_same(bn->weight));
  CHECK(sync->running_mean.is_same(bn->running_mean));
  CHECK(sync->options.eps() == 1e-3);
  CHECK(sync->named_parameters().size() == 2);
  CHECK(sync->named_buffers().size() == 3);
  CHECK_THROWS_WITH(sync->forward(torch::zeros({4, 5, 2, 2})), Catch::Contains("has 5 channels"));
  CHECK_THROWS_WITH(sync->forward(torch::zeros({4})), Catch::Contains("2-d to 5-d"));
  auto clone = std::dynamic_pointer_cast<cpprun::SyncBatchNormImpl>(sync->clone());
  REQUIRE(clone);
  CHECK_FALSE(clone->weight.is_same(sync->weight));
  CHECK(clone->weight.equal(sync->weight));
}

TEST_CASE("sync batch norm: conversion replaces a BatchNorm in a ModuleDict where the dict finds it", "[syncbn]") {
  torch::OrderedDict<std::string, std::shared_ptr<torch::nn::Module>> children;
  children.insert("norm", torch::nn::BatchNorm1d(4).ptr());
  children.insert("fc", torch::nn::Linear(4, 2).ptr());
  torch::nn::ModuleDict dict(children);
  cpprun::convert_sync_batchnorm(dict.ptr(), group());
  // operator[] and iteration read the dict's own map: they returned the old BatchNorm, which a
  // forward through the dict then ran without syncing.
  CHECK(dict["norm"]->as<cpprun::SyncBatchNormImpl>() != nullptr);
  CHECK(dict->named_children()["norm"]->as<cpprun::SyncBatchNormImpl>() != nullptr);
  for (const auto& item : *dict) CHECK(item.value()->as<torch::nn::BatchNorm1d>() == nullptr);
}
