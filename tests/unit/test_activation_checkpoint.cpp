// cpprun::checkpoint in one process: the same gradients as running the function normally (with
// dropout: the same mask), the function run once more in backward, parameters reached without
// being inputs, and a clear error for a captured activation.
#include "catch.h"
#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <set>
#include <string>
#include <vector>

#include "cpprun/activation_checkpoint.h"

namespace {

struct Block : torch::nn::Module {
  torch::nn::Linear fc{nullptr};
  torch::nn::Dropout drop{nullptr};
  explicit Block(int64_t width) {
    fc = register_module("fc", torch::nn::Linear(width, width));
    drop = register_module("drop", torch::nn::Dropout(0.3));
  }
  torch::Tensor forward(torch::Tensor x) { return x + drop(torch::gelu(fc(x))); }
};

struct Stack : torch::nn::Module {
  std::vector<std::shared_ptr<Block>> blocks;
  bool checkpointed = false;
  int calls = 0;  // forward runs of a block, counted to see the recomputation
  Stack(int n, int64_t width) {
    for (int i = 0; i < n; ++i) blocks.push_back(register_module("b" + std::to_string(i), std::make_shared<Block>(width)));
  }
  torch::Tensor forward(torch::Tensor x) {
    for (auto& block : blocks) {
      auto run = [this, block](const torch::Tensor& h) {
        ++calls;
        return block->forward(h);
      };
      x = checkpointed ? cpprun::checkpoint(run, x) : run(x);
    }
    return x.pow(2).mean();
  }
};

void check_same_grads(torch::nn::Module& a, torch::nn::Module& b) {
  auto pb = b.named_parameters();
  for (const auto& item : a.named_parameters()) {
    INFO(item.key());
    REQUIRE(item.value().grad().defined());
    CHECK(torch::allclose(item.value().grad(), pb[item.key()].grad(), 1e-6, 1e-7));
  }
}

}  // namespace

TEST_CASE("checkpoint: the same gradients and dropout masks as without it", "[checkpoint]") {
  torch::manual_seed(0);
  Stack plain(4, 16), ckpt(4, 16);
  {
    torch::NoGradGuard no_grad;
    auto src = plain.named_parameters();
    for (auto& item : ckpt.named_parameters()) item.value().copy_(src[item.key()]);
  }
  ckpt.checkpointed = true;
  auto x = torch::randn({8, 16});
  auto x_plain = x.clone().requires_grad_(), x_ckpt = x.clone().requires_grad_();

  torch::manual_seed(7);
  auto loss_plain = plain.forward(x_plain);
  loss_plain.backward();
  const auto after_plain = torch::rand({4});  // what the generator gives after the step

  torch::manual_seed(7);
  auto loss_ckpt = ckpt.forward(x_ckpt);
  CHECK(ckpt.calls == 4);
  loss_ckpt.backward();
  CHECK(ckpt.calls == 8);  // each block ran once more in backward
  const auto after_ckpt = torch::rand({4});

  CHECK(loss_plain.item<double>() == loss_ckpt.item<double>());
  check_same_grads(ckpt, plain);
  CHECK(torch::allclose(x_ckpt.grad(), x_plain.grad(), 1e-6, 1e-7));
  // The recomputation replayed the generator and put it back: later draws are unchanged.
  CHECK(torch::equal(after_plain, after_ckpt));
}

TEST_CASE("checkpoint: parameters get gradients when no input requires grad", "[checkpoint]") {
  torch::manual_seed(1);
  auto fc = torch::nn::Linear(5, 3);
  auto x = torch::randn({4, 5});  // plain data: requires no grad
  // A holder captured by value is const in the lambda: capture its shared_ptr.
  auto out = cpprun::checkpoint([layer = fc.ptr()](const torch::Tensor& h) { return layer->forward(h).tanh(); }, x);
  REQUIRE(out.requires_grad());
  out.sum().backward();
  auto expected_w = fc->weight.grad().clone();
  fc->weight.mutable_grad() = torch::Tensor();
  fc->forward(x).tanh().sum().backward();
  CHECK(torch::allclose(expected_w, fc->weight.grad()));
}

TEST_CASE("checkpoint: several inputs and outputs, some without gradients", "[checkpoint]") {
  auto a = torch::randn({3}).requires_grad_(), b = torch::randn({3}), c = torch::randn({3}).requires_grad_();
  auto f = [](const std::vector<torch::Tensor>& in) {
    return std::vector<torch::Tensor>{in[0] * in[1], (in[2] * in[0]).exp(), in[1] + 1};
  };
  auto outs = cpprun::checkpoint(f, {a, b, c});
  REQUIRE(outs.size() == 3);
  CHECK_FALSE(outs[2].requires_grad());
  (outs[0].sum() + outs[1].sum()).backward();
  auto a2 = a.detach().clone().requires_grad_(), c2 = c.detach().clone().requires_grad_();
  auto ref = f({a2, b, c2});
  (ref[0].sum() + ref[1].sum()).backward();
  CHECK(torch::allclose(a.grad(), a2.grad()));
  CHECK(torch::allclose(c.grad(), c2.grad()));
}

TEST_CASE("checkpoint: a captured activation is refused with the fix", "[checkpoint]") {
  auto w = torch::randn({3}).requires_grad_();
  auto hidden = w * 2;  // not a leaf, made before the function
  auto x = torch::randn({3}).requires_grad_();
  REQUIRE_THROWS_WITH(cpprun::checkpoint([hidden](const torch::Tensor& h) { return h * hidden; }, x),
                      Catch::Contains("pass that tensor to checkpoint() as an input"));
}

TEST_CASE("checkpoint: under autocast, steps after the first use the updated weights (no cast outlives a region)",
          "[checkpoint]") {
  // at::linear under CPU autocast casts the bias, a leaf, and autocast caches that cast until its
  // region ends. The recomputation in backward is a region of its own: a cast it cached, kept,
  // would be the next step's (the bias before the optimizer changed it), made before that step's
  // segment ran.
  torch::manual_seed(3);
  auto weight = (torch::randn({4, 4}) * 0.3).requires_grad_();
  auto bias = torch::randn({4}).requires_grad_();
  auto plain_weight = weight.detach().clone().requires_grad_(), plain_bias = bias.detach().clone().requires_grad_();
  const auto x = torch::randn({2, 3, 4});
  torch::optim::SGD checkpointed_sgd({weight, bias}, 0.5), plain_sgd({plain_weight, plain_bias}, 0.5);
  at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
  // Each model's steps in a row: nothing between one's backward and its next forward clears the cache.
  for (bool checkpointed : {true, false}) {
    for (int step = 0; step < 3; ++step) {
      auto& w = checkpointed ? weight : plain_weight;
      auto& b = checkpointed ? bias : plain_bias;
      auto layer = [&](const torch::Tensor& h) { return at::linear(h, w, b); };
      at::autocast::set_autocast_enabled(at::kCPU, true);
      auto y = checkpointed ? cpprun::checkpoint(layer, x) : layer(x);
      at::autocast::set_autocast_enabled(at::kCPU, false);
      at::autocast::clear_cache();  // what leaving the forward's torch.autocast region does
      auto& sgd = checkpointed ? checkpointed_sgd : plain_sgd;
      sgd.zero_grad();
      y.to(torch::kFloat).pow(2).sum().backward();
      sgd.step();
    }
  }
  CHECK(torch::allclose(weight, plain_weight, 1e-6, 1e-6));
  CHECK(torch::allclose(bias, plain_bias, 1e-6, 1e-6));
}

TEST_CASE("checkpoint: outside grad mode the function just runs", "[checkpoint]") {
  int calls = 0;
  auto x = torch::randn({2}).requires_grad_();
  torch::NoGradGuard no_grad;
  auto y = cpprun::checkpoint([&calls](const torch::Tensor& h) { ++calls; return h * 3; }, x);
  CHECK(calls == 1);
  CHECK_FALSE(y.requires_grad());
}

TEST_CASE("checkpoint: activations are not kept between forward and backward", "[checkpoint]") {
  // A segment's intermediate results stay alive only if the graph holds them: count the tensors
  // the graph saved, through how many storages the output's graph keeps alive.
  torch::manual_seed(2);
  Stack model(6, 64);
  model.checkpointed = true;
  auto x = torch::randn({32, 64}).requires_grad_();
  auto loss = model.forward(x);
  // The only graph is ours: each checkpoint node's next edges go to its input and parameters,
  // none to the gelu/dropout/linear nodes of a block.
  std::vector<torch::autograd::Node*> stack{loss.grad_fn().get()};
  std::set<std::string> names;
  std::set<torch::autograd::Node*> seen;
  while (!stack.empty()) {
    auto* node = stack.back();
    stack.pop_back();
    if (!seen.insert(node).second) continue;
    names.insert(node->name());
    for (const auto& e : node->next_edges()) {
      if (e.function) stack.push_back(e.function.get());
    }
  }
  for (const auto& name : names) {
    INFO(name);
    CHECK(name.find("Gelu") == std::string::npos);
    CHECK(name.find("Addmm") == std::string::npos);
  }
  loss.backward();
}

namespace {

// A Sequential member that counts its runs, to see which segments are recomputed.
struct Counted : torch::nn::Module {
  torch::nn::Linear fc{nullptr};
  torch::nn::Dropout drop{nullptr};
  std::shared_ptr<int> calls;
  Counted(int64_t width, std::shared_ptr<int> counter) : calls(std::move(counter)) {
    fc = register_module("fc", torch::nn::Linear(torch::nn::LinearOptions(width, width)));
    drop = register_module("drop", torch::nn::Dropout(0.2));
  }
  torch::Tensor forward(torch::Tensor x) {
    ++*calls;
    return drop(torch::tanh(fc(x)));
  }
};

}  // namespace

TEST_CASE("checkpoint_sequential: as torch.utils.checkpoint's, the last segment kept", "[checkpoint]") {
  constexpr int kModules = 5;
  // segments -> how many module runs the backward repeats: (segments - 1) chunks of 5 / segments,
  // checkpointed; the last segment (the rest) is not (torch.utils.checkpoint.checkpoint_sequential).
  const auto [segments, recomputed] = GENERATE(table<int, int>({{1, 0}, {2, 2}, {3, 2}, {5, 4}}));
  INFO("segments " << segments);
  auto calls = std::make_shared<int>(0);
  torch::manual_seed(0);
  torch::nn::Sequential body;
  for (int i = 0; i < kModules; ++i) body->push_back(Counted(6, calls));
  body->to(torch::kDouble);
  const auto x = torch::randn({4, 6}, torch::kDouble);

  // Plain, then checkpointed, from the same generator state: equal outputs and gradients (float64;
  // dropout's masks replayed).
  torch::manual_seed(9);
  const auto plain_in = x.clone().requires_grad_();
  body->forward(plain_in).pow(2).sum().backward();
  std::vector<torch::Tensor> plain_grads;
  for (auto& p : body->parameters()) {
    plain_grads.push_back(p.grad().clone());
    p.mutable_grad() = torch::Tensor();
  }
  *calls = 0;
  torch::manual_seed(9);
  const auto in = x.clone().requires_grad_();
  const auto out = cpprun::checkpoint_sequential(body, segments, in);
  CHECK(*calls == kModules);
  out.pow(2).sum().backward();
  CHECK(*calls == kModules + recomputed);
  const auto params = body->parameters();
  for (size_t i = 0; i < params.size(); ++i) CHECK(torch::allclose(params[i].grad(), plain_grads[i], 1e-12, 1e-14));
  CHECK(torch::allclose(in.grad(), plain_in.grad(), 1e-12, 1e-14));
}

TEST_CASE("checkpoint_sequential: functions, and segments out of range refused", "[checkpoint]") {
  std::vector<std::function<torch::Tensor(const torch::Tensor&)>> functions{
      [](const torch::Tensor& h) { return h * 2; }, [](const torch::Tensor& h) { return h + 1; },
      [](const torch::Tensor& h) { return h.sin(); }};
  const auto x = torch::randn({3}, torch::kDouble).requires_grad_();
  const auto y = cpprun::checkpoint_sequential(functions, 2, x);
  CHECK(torch::allclose(y, (x * 2 + 1).sin()));
  y.sum().backward();
  CHECK(torch::allclose(x.grad(), 2 * (x.detach() * 2 + 1).cos()));
  CHECK_THROWS_WITH(cpprun::checkpoint_sequential(functions, 0, x), Catch::Contains("segments must be from 1 to the number of functions (3), not 0"));
  CHECK_THROWS_WITH(cpprun::checkpoint_sequential(functions, 4, x), Catch::Contains("not 4"));
}
