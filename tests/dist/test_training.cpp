// Activation checkpointing and the loss scaler under DDP and ZeRO-1/2/3, at 1-4 ranks. Each rank
// trains the wrapped model on its slice of every global batch; a reference model in one process
// runs each rank's slice in turn, with that rank's dropout seed and without checkpointing, and
// must end with the same parameters, in float64 (Note [Parity in float64] in parity_checks.h).
// CHECK, not REQUIRE, keeps the ranks' collectives in step.
#include "catch.h"
#include <torch/torch.h>

#include <cstddef>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "cpprun/cpprun.h"
#include "ddp_test_models.h"
#include "parity_checks.h"
#include "dist_test_support.h"

using namespace ddp_test;

namespace {

using dist_test::group;
using dist_test::slice;

constexpr int64_t kGlobalBatch = 24;
constexpr int64_t kWidth = 13;  // units of 182 elements: divisible by none of 3 and 4

struct Block : torch::nn::Module {
  torch::nn::Linear fc{nullptr};
  torch::nn::Dropout drop{nullptr};
  Block() {
    fc = register_module("fc", torch::nn::Linear(kWidth, kWidth));
    drop = register_module("drop", torch::nn::Dropout(0.25));
  }
  torch::Tensor forward(torch::Tensor x) { return x + drop(torch::tanh(fc(x))); }
};

// Input and output layers around three blocks; `checkpointed` runs each block under
// cpprun::checkpoint.
struct Net : torch::nn::Module {
  torch::nn::Linear in{nullptr}, out{nullptr};
  std::vector<std::shared_ptr<Block>> blocks;
  bool checkpointed;
  explicit Net(bool checkpointed_blocks) : checkpointed(checkpointed_blocks) {
    in = register_module("in", torch::nn::Linear(10, kWidth));
    for (int i = 0; i < 3; ++i) blocks.push_back(register_module("b" + std::to_string(i), std::make_shared<Block>()));
    out = register_module("out", torch::nn::Linear(kWidth, 4));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(in(x));
    for (auto& block : blocks) {
      x = checkpointed ? cpprun::checkpoint([block](const torch::Tensor& h) { return block->forward(h); }, x)
                       : block->forward(x);
    }
    return out(x);
  }
};
bool is_block(const torch::nn::Module& m) { return dynamic_cast<const Block*>(&m) != nullptr; }

// The seed of rank r's dropout masks at a step: the reference replays it for r's slice.
void seed_dropout(int step, int rank, int world) { torch::manual_seed(5000 + step * world + rank); }

// DDP or FSDP behind the interface both offer: the training loops below are written once.
template <typename Module>
cpprun::DataParallel<Module> wrap(const std::string& how, const std::shared_ptr<Module>& net,
                                  const std::function<bool(const torch::nn::Module&)>& unit_policy) {
  if (how == "ddp") return cpprun::DistributedDataParallel(net, group());
  const int stage = how.back() - '0';
  return cpprun::FullyShardedDataParallel(net, group(), cpprun::FsdpOptions().stage(stage).wrap_policy(unit_policy));
}

torch::Tensor loss_of(const torch::Tensor& logits, const torch::Tensor& targets) {
  return torch::nn::functional::cross_entropy(logits, targets);
}

// The reference's gradients for a global batch: each rank's slice with that rank's dropout seed.
void reference_backward(Net& ref, int step, int world, const torch::Tensor& x, const torch::Tensor& y) {
  for (int r = 0; r < world; ++r) {
    seed_dropout(step, r, world);
    (loss_of(ref.forward(slice(x, r, world)), slice(y, r, world)) / world).backward();
  }
}

const std::vector<std::string> kWrappers = {"ddp", "zero1", "zero2", "zero3"};

// Scalers built before main, so before init_process_group() (a member or a global, as users
// hold them): they must agree over the default group all the same (Note [A scaler built before
// the process group]). One per wrapper, as the test below trains each from the initial scale.
const bool g_scalers_built_before_the_group = !cpprun::is_initialized();
std::vector<cpprun::GradScaler> g_scalers_built_early = [] {
  std::vector<cpprun::GradScaler> scalers;
  for (std::size_t i = 0; i < kWrappers.size(); ++i) {
    scalers.emplace_back(cpprun::GradScalerOptions().init_scale(1024).growth_interval(3));
  }
  return scalers;
}();

// A small language model whose output layer is the token embedding, transposed: one tensor under
// two names ("embed.weight", "head.weight"). The head has a bias of its own, so that it can be a
// unit without the tied weight.
constexpr int64_t kVocab = 11;
struct TiedHead : torch::nn::Module {
  torch::Tensor weight, bias;
  explicit TiedHead(const torch::Tensor& embedding) {
    weight = register_parameter("weight", embedding);
    bias = register_parameter("bias", torch::zeros({kVocab}));
  }
  torch::Tensor forward(const torch::Tensor& x) { return torch::matmul(x, weight.t()) + bias; }
};
struct TiedLm : torch::nn::Module {
  torch::nn::Embedding embed{nullptr};
  std::shared_ptr<Block> block;
  std::shared_ptr<TiedHead> head;
  TiedLm() {
    embed = register_module("embed", torch::nn::Embedding(kVocab, kWidth));
    block = register_module("block", std::make_shared<Block>());
    head = register_module("head", std::make_shared<TiedHead>(embed->weight));
  }
  torch::Tensor forward(torch::Tensor tokens) { return head->forward(block->forward(embed(tokens))); }
};

}  // namespace

TEST_CASE("checkpointed blocks with dropout match one process under DDP and ZeRO-1/2/3", "[checkpoint]") {
  Float64Parity float64;
  const int rank = group().rank(), world = group().size();
  for (const auto& how : kWrappers) {
    INFO("wrapper " << how);
    torch::manual_seed(100 + rank);  // rank 0's initial weights must win
    auto net = std::make_shared<Net>(/*checkpointed_blocks=*/true);
    auto model = wrap<Net>(how, net, is_block);
    auto ref = std::make_shared<Net>(/*checkpointed_blocks=*/false);
    copy_state(*ref, *net);
    torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-3));
    torch::optim::AdamW ref_opt(ref->parameters(), torch::optim::AdamWOptions(1e-3));
    for (int step = 0; step < 4; ++step) {
      auto x = inputs_for("mlp", kGlobalBatch, step);
      auto y = targets_for(kGlobalBatch, step);
      opt.zero_grad();
      seed_dropout(step, rank, world);
      loss_of(model->forward(slice(x, rank, world)), slice(y, rank, world)).backward();
      opt.step();
      ref_opt.zero_grad();
      reference_backward(*ref, step, world, x, y);
      ref_opt.step();
    }
    model->gather_full_parameters();
    check_same_parameters(*net, *ref, kParityTolerance);
  }
}

TEST_CASE("GradScaler: an overflow on one rank skips the step on every rank, then training recovers",
          "[grad_scaler]") {
  Float64Parity float64;
  const int rank = group().rank(), world = group().size();
  constexpr int kOverflowStep = 2;
  REQUIRE(g_scalers_built_before_the_group);
  for (std::size_t w = 0; w < 2 * kWrappers.size(); ++w) {
    const std::string& how = kWrappers[w / 2];
    const bool built_early = w % 2 == 1;
    INFO("wrapper " << how << (built_early ? ", the scaler built before the process group" : ""));
    torch::manual_seed(100 + rank);
    auto net = std::make_shared<Net>(/*checkpointed_blocks=*/false);
    auto model = wrap<Net>(how, net, is_block);
    auto ref = std::make_shared<Net>(/*checkpointed_blocks=*/false);
    copy_state(*ref, *net);
    torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    torch::optim::SGD ref_opt(ref->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    cpprun::GradScaler with_group(group(), cpprun::GradScalerOptions().init_scale(1024).growth_interval(3));
    cpprun::GradScaler& scaler = built_early ? g_scalers_built_early[w / 2] : with_group;
    for (int step = 0; step < 6; ++step) {
      auto x = inputs_for("mlp", kGlobalBatch, step);
      auto y = targets_for(kGlobalBatch, step);
      opt.zero_grad();
      seed_dropout(step, rank, world);
      scaler.scale(loss_of(model->forward(slice(x, rank, world)), slice(y, rank, world))).backward();
      if (step == kOverflowStep && rank == world - 1) {
        // Only the last rank sees it: under ZeRO-2/3 in its own shard of the gradients.
        for (auto& p : model->parameters()) {
          if (p.grad().defined() && p.grad().numel() > 0) {
            p.mutable_grad().view(-1)[0] = std::numeric_limits<float>::infinity();
            break;
          }
        }
      }
      const bool stepped = scaler.step(opt);
      scaler.update();
      CHECK(stepped == (step != kOverflowStep));
      if (step == kOverflowStep) CHECK(scaler.get_scale() == 512);
      if (step != kOverflowStep) {  // the reference skips the same step
        ref_opt.zero_grad();
        reference_backward(*ref, step, world, x, y);
        ref_opt.step();
      }
    }
    CHECK(scaler.get_scale() == 1024);  // grew back after growth_interval clean steps
    model->gather_full_parameters();
    check_same_parameters(*net, *ref, kParityTolerance);  // power-of-two scales: unscaled gradients are exact
  }
}

TEST_CASE("tied embedding and output weights match one process under DDP and ZeRO-1/2/3, in one unit or two",
          "[tied]") {
  Float64Parity float64;
  const int rank = group().rank(), world = group().size();
  // "one unit": embedding and head in the root unit; "two units": the head is a unit of its own
  // and uses the tied weight that lives in the root unit.
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"ddp", ""}, {"zero1", "one unit"}, {"zero2", "one unit"}, {"zero3", "one unit"},
      {"zero1", "two units"}, {"zero2", "two units"}, {"zero3", "two units"}};
  for (const auto& [how, layout] : cases) {
    INFO("wrapper " << how << " " << layout);
    torch::manual_seed(100 + rank);
    auto net = std::make_shared<TiedLm>();
    REQUIRE(net->head->weight.is_same(net->embed->weight));
    auto policy = [layout = layout](const torch::nn::Module& m) {
      return dynamic_cast<const Block*>(&m) != nullptr ||
             (layout == "two units" && dynamic_cast<const TiedHead*>(&m) != nullptr);
    };
    auto model = wrap<TiedLm>(how, net, policy);
    if (auto* fsdp = dynamic_cast<cpprun::FullyShardedDataParallelImpl<TiedLm>*>(model.ptr().get())) {
      CHECK(fsdp->unit_count() == (layout == "two units" ? 3u : 2u));
    }
    auto ref = std::make_shared<TiedLm>();
    copy_state(*ref, *net);
    // Each tensor once: under DDP the tied weight is listed under two names.
    torch::optim::AdamW opt(cpprun::unique_parameters(*model), torch::optim::AdamWOptions(1e-2));
    torch::optim::AdamW ref_opt(cpprun::unique_parameters(*ref), torch::optim::AdamWOptions(1e-2));
    for (int step = 0; step < 4; ++step) {
      torch::manual_seed(3000 + step);
      auto tokens = torch::randint(0, kVocab, {kGlobalBatch}, torch::kLong);
      auto targets = (tokens + 1) % kVocab;
      opt.zero_grad();
      seed_dropout(step, rank, world);
      loss_of(model->forward(slice(tokens, rank, world)), slice(targets, rank, world)).backward();
      // The tied weight's gradient counts once (and is scaled once), as torch.nn.utils.clip_grad_norm_
      // counts a Python module's parameters: each once.
      const double norm = model->clip_grad_norm(0.5);
      opt.step();
      ref_opt.zero_grad();
      for (int r = 0; r < world; ++r) {
        seed_dropout(step, r, world);
        (loss_of(ref->forward(slice(tokens, r, world)), slice(targets, r, world)) / world).backward();
      }
      const double ref_norm = torch::nn::utils::clip_grad_norm_(cpprun::unique_parameters(*ref), 0.5);
      CHECK(norm == Approx(ref_norm).epsilon(kParityTolerance));
      ref_opt.step();
    }
    model->gather_full_parameters();
    CHECK(net->head->weight.is_same(net->embed->weight));  // still one tensor
    check_same_parameters(*net, *ref, kParityTolerance);
  }
}
