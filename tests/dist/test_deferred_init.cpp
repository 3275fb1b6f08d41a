// Deferred initialisation under FullyShardedDataParallel at 1-4 ranks, ZeRO-1/2/3: a model built
// with cpprun::deferred_init and wrapped has, gathered, exactly the parameters eager construction
// gives rank 0 with the same seed (every rank seeds differently, so rank 0's values must have
// been broadcast), every rank's generator ends where its eager construction would leave it, and
// training then matches one process, in float64 (Note [Parity in float64] in parity_checks.h).
// CHECK, not REQUIRE, keeps the ranks' collectives in step.
#include "catch.h"
#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "cpprun/cpprun.h"
#include "ddp_test_models.h"
#include "dist_test_support.h"
#include "parity_checks.h"

using namespace ddp_test;

namespace {

using dist_test::group;
using dist_test::slice;

constexpr int64_t kGlobalBatch = 24;
constexpr int64_t kWidth = 13;  // units of odd sizes: divisible by neither 3 nor 4
constexpr int64_t kVocab = 11;

struct Block : torch::nn::Module {
  torch::nn::LayerNorm norm{nullptr};
  torch::nn::Linear fc{nullptr};
  Block() {
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kWidth})));
    fc = register_module("fc", torch::nn::Linear(kWidth, kWidth));
  }
  torch::Tensor forward(torch::Tensor x) { return x + torch::tanh(fc(norm(x))); }
};
bool is_block(const torch::nn::Module& m) { return dynamic_cast<const Block*>(&m) != nullptr; }

struct TiedHead : torch::nn::Module {
  torch::Tensor weight;
  explicit TiedHead(const torch::Tensor& embedding) { weight = register_parameter("weight", embedding); }
  torch::Tensor forward(const torch::Tensor& x) { return torch::matmul(x, weight.t()); }
};

// GPT's shape: a token embedding that is also the output layer, blocks, a final norm. The
// embedding is built first but lives in the root unit, flattened last: materialising unit by
// unit must still draw its values first.
struct TinyLm : torch::nn::Module {
  torch::nn::Embedding embed{nullptr};
  std::vector<std::shared_ptr<Block>> blocks;
  torch::nn::LayerNorm norm{nullptr};
  std::shared_ptr<TiedHead> head;
  TinyLm() {
    embed = register_module("embed", torch::nn::Embedding(kVocab, kWidth));
    for (int i = 0; i < 3; ++i) blocks.push_back(register_module("b" + std::to_string(i), std::make_shared<Block>()));
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kWidth})));
    head = register_module("head", std::make_shared<TiedHead>(embed->weight));
    torch::nn::init::normal_(embed->weight, 0, 0.02);
  }
  torch::Tensor forward(torch::Tensor tokens) {
    auto x = embed(tokens);
    for (auto& block : blocks) x = block->forward(x);
    return head->forward(norm(x));
  }
};

torch::Tensor loss_of(const torch::Tensor& logits, const torch::Tensor& targets) {
  return torch::nn::functional::cross_entropy(logits, targets);
}

}  // namespace

TEST_CASE("deferred init under ZeRO-1/2/3: eager init's values after wrapping, then one process's training",
          "[deferred_init]") {
  Float64Parity float64;
  const int rank = group().rank(), world = group().size();
  for (int stage : {1, 2, 3}) {
    INFO("stage " << stage);
    // What eager construction gives rank 0 (the values FSDP starts from) and this rank's
    // generator afterwards.
    torch::manual_seed(40);
    auto ref = std::make_shared<TinyLm>();
    torch::manual_seed(40 + rank);
    std::make_shared<TinyLm>();
    const auto eager_next = torch::rand({6});

    torch::manual_seed(40 + rank);
    auto net = cpprun::deferred_init([] { return std::make_shared<TinyLm>(); });
    for (const auto& p : net->parameters()) CHECK(cpprun::is_deferred(p));
    auto model = cpprun::FullyShardedDataParallel(net, group(), cpprun::FsdpOptions().stage(stage).wrap_policy(is_block));
    CHECK(torch::equal(torch::rand({6}), eager_next));
    CHECK(model->unit_count() == 4u);
    for (const auto& p : net->parameters()) CHECK_FALSE(cpprun::is_deferred(p));
    // Only the shards are left (alone, nothing is sharded: Note [Nothing to shard alone]).
    if (stage == 3) CHECK((model->memory().parameters == 0) == (world > 1));
    model->gather_full_parameters();
    CHECK(net->head->weight.is_same(net->embed->weight));
    check_same_parameters(*net, *ref, 0.0);  // exactly

    torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-2));
    torch::optim::AdamW ref_opt(cpprun::unique_parameters(*ref), torch::optim::AdamWOptions(1e-2));
    for (int step = 0; step < 4; ++step) {
      torch::manual_seed(3000 + step);
      auto tokens = torch::randint(0, kVocab, {kGlobalBatch}, torch::kLong);
      auto targets = (tokens * 3 + 1) % kVocab;
      opt.zero_grad();
      loss_of(model->forward(slice(tokens, rank, world)), slice(targets, rank, world)).backward();
      opt.step();
      ref_opt.zero_grad();
      for (int r = 0; r < world; ++r) {
        (loss_of(ref->forward(slice(tokens, r, world)), slice(targets, r, world)) / world).backward();
      }
      ref_opt.step();
    }
    model->gather_full_parameters();
    check_same_parameters(*net, *ref, kParityTolerance);
  }
}

TEST_CASE("deferred init under ZeRO-3: a Linear stack, unit by unit, equals eager init and trains", "[deferred_init]") {
  Float64Parity float64;
  const int rank = group().rank(), world = group().size();
  auto make = [] {
    torch::nn::Sequential net(torch::nn::Linear(10, 24), torch::nn::ReLU());
    for (int i = 0; i < 3; ++i) net->push_back(torch::nn::Linear(24, 24)), net->push_back(torch::nn::ReLU());
    net->push_back(torch::nn::Linear(24, 4));
    return net;
  };
  torch::manual_seed(9);
  auto ref = make();
  torch::manual_seed(9);
  auto net = cpprun::deferred_init(make);
  auto model = cpprun::FullyShardedDataParallel(net, group(), cpprun::FsdpOptions().stage(3).wrap_policy(is_linear));
  CHECK(model->unit_count() == 5u);
  model->gather_full_parameters();
  check_same_parameters(*net, *ref, 0.0);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  torch::optim::SGD ref_opt(ref->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  for (int step = 0; step < 4; ++step) {
    torch::manual_seed(700 + step);
    auto x = torch::randn({kGlobalBatch, 10});
    auto y = torch::randint(0, 4, {kGlobalBatch}, torch::kLong);
    opt.zero_grad();
    loss_of(model->forward(slice(x, rank, world)), slice(y, rank, world)).backward();
    opt.step();
    ref_opt.zero_grad();
    loss_of(ref->forward(x), y).backward();
    ref_opt.step();
  }
  model->gather_full_parameters();
  check_same_parameters(*net, *ref, kParityTolerance);
}
