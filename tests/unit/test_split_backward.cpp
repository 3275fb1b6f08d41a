// pipeline/split_backward.h: a stage's backward as an input pass and a later weight pass gives
// the gradients one backward gives (float64, to rounding), the weight pass really does wait (after
// the input pass the weights have no gradient yet), and the cases where splitting would be wrong
// (a layer applied twice, an input that needs no gradient) fall back to the whole backward at once.
#include "catch.h"

#include <torch/torch.h>

#include <functional>
#include <vector>

#include "cpprun/activation_checkpoint.h"
#include "pipeline/split_backward.h"

namespace {

using cpprun::detail::SplitBackward;

struct DoubleByDefault {
  DoubleByDefault() { torch::set_default_dtype(caffe2::TypeMeta::Make<double>()); }
  ~DoubleByDefault() { torch::set_default_dtype(caffe2::TypeMeta::Make<float>()); }
};

// A GPT block's shape of graph: layer norms, a fused q/k/v projection split in three, causal
// attention, residuals, a GELU MLP; weights used once each.
struct SplitBlock : torch::nn::Module {
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  torch::nn::Linear qkv{nullptr}, proj{nullptr}, fc{nullptr}, out{nullptr};
  SplitBlock() {
    ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({8})));
    ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({8})));
    qkv = register_module("qkv", torch::nn::Linear(8, 24));
    proj = register_module("proj", torch::nn::Linear(8, 8));
    fc = register_module("fc", torch::nn::Linear(8, 32));
    out = register_module("out", torch::nn::Linear(32, 8));
  }
  at::Tensor forward(const at::Tensor& x) {
    auto parts = qkv->forward(ln1->forward(x)).view({x.size(0), x.size(1), 3, 2, 4}).unbind(2);
    auto attended = at::scaled_dot_product_attention(parts[0].transpose(1, 2), parts[1].transpose(1, 2),
                                                     parts[2].transpose(1, 2), {}, 0.0, /*is_causal=*/true);
    auto h = x + proj->forward(attended.transpose(1, 2).reshape_as(x));
    return h + out->forward(torch::gelu(fc->forward(ln2->forward(h))));
  }
};

std::vector<at::Tensor> grads_of(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> grads;
  for (const auto& p : params) grads.push_back(p.grad().defined() ? p.grad().clone() : at::Tensor());
  return grads;
}

void zero(const std::vector<at::Tensor>& params) {
  for (auto p : params) p.mutable_grad() = at::Tensor();
}

void check_close(const std::vector<at::Tensor>& got, const std::vector<at::Tensor>& expected) {
  REQUIRE(got.size() == expected.size());
  for (size_t k = 0; k < got.size(); ++k) {
    INFO("parameter " << k);
    REQUIRE(got[k].defined() == expected[k].defined());
    if (got[k].defined()) CHECK(torch::allclose(got[k], expected[k], 1e-12, 1e-14));
  }
}

// The whole backward's gradients (weights, then the input's) against the split's.
void check_split_matches_whole(const std::function<at::Tensor(const at::Tensor&)>& forward,
                               const std::vector<at::Tensor>& params, const at::Tensor& x, bool expect_split) {
  zero(params);
  auto input = x.detach().requires_grad_(true);
  auto y = forward(input);
  const auto grad_out = torch::randn_like(y);
  y.backward(grad_out);
  const auto expected = grads_of(params);
  const auto expected_input = input.grad().clone();

  zero(params);
  input = x.detach().requires_grad_(true);
  y = forward(input);
  SplitBackward parts({y}, {grad_out}, input, params);
  CHECK(parts.split() == expect_split);
  CHECK(torch::allclose(parts.input_grad(), expected_input, 1e-12, 1e-14));
  if (expect_split) {
    for (const auto& p : params) CHECK_FALSE(p.grad().defined());  // the weights' part really waits
  }
  parts.backward_weights();
  check_close(grads_of(params), expected);
}

}  // namespace

TEST_CASE("split backward: a GPT block's input pass then weight pass give one backward's gradients", "[pipeline]") {
  DoubleByDefault doubles;
  torch::manual_seed(1);
  auto block = std::make_shared<SplitBlock>();
  const auto x = torch::randn({2, 5, 8});
  check_split_matches_whole([&](const at::Tensor& in) { return block->forward(in); }, block->parameters(), x, true);
  // Gradients already there are added to, as backward adds (a second micro-batch).
  zero(block->parameters());
  auto first = x.detach().requires_grad_(true);
  block->forward(first).sum().backward();
  const auto once = grads_of(block->parameters());
  auto second = x.detach().requires_grad_(true);
  SplitBackward parts({block->forward(second).sum()}, {}, second, block->parameters());
  parts.backward_weights();
  for (size_t k = 0; k < once.size(); ++k) CHECK(torch::allclose(block->parameters()[k].grad(), 2 * once[k], 1e-12, 1e-14));
}

TEST_CASE("split backward: a layer applied twice, one use below the other, falls back to one backward", "[pipeline]") {
  DoubleByDefault doubles;
  torch::manual_seed(2);
  torch::nn::Linear shared(6, 6), other(6, 6);
  auto twice = [&](const at::Tensor& in) { return shared->forward(torch::tanh(other->forward(shared->forward(in)))); };
  std::vector<at::Tensor> params = shared->parameters();
  for (const auto& p : other->parameters()) params.push_back(p);
  check_split_matches_whole(twice, params, torch::randn({4, 6}), /*expect_split=*/false);
}

TEST_CASE("split backward: the first stage (no input gradient) runs its whole backward in the input pass",
          "[pipeline]") {
  DoubleByDefault doubles;
  torch::manual_seed(3);
  torch::nn::Embedding embed(10, 4);
  torch::nn::Linear head(4, 3);
  std::vector<at::Tensor> params{embed->weight, head->weight, head->bias};
  const auto tokens = torch::randint(10, {5});
  auto loss = [&] { return head->forward(embed->forward(tokens)).pow(2).mean(); };
  loss().backward();
  const auto expected = grads_of(params);
  zero(params);
  SplitBackward parts({loss()}, {}, at::Tensor(), params);
  CHECK_FALSE(parts.split());
  CHECK_FALSE(parts.input_grad().defined());
  check_close(grads_of(params), expected);  // already there
  parts.backward_weights();                  // and nothing more
  check_close(grads_of(params), expected);
}

TEST_CASE("split backward: an output that does not depend on the input gives it zeros", "[pipeline]") {
  DoubleByDefault doubles;
  torch::nn::Linear layer(3, 3);
  auto input = torch::randn({2, 3}).requires_grad_(true);
  SplitBackward parts({layer->forward(torch::ones({2, 3})).sum()}, {}, input, layer->parameters());
  CHECK(torch::equal(parts.input_grad(), torch::zeros({2, 3})));
  parts.backward_weights();
  CHECK(torch::allclose(layer->bias.grad(), torch::full({3}, 2.0)));
}

TEST_CASE("split backward: an activation-checkpointed segment gives one backward's gradients", "[pipeline]") {
  DoubleByDefault doubles;
  torch::manual_seed(4);
  torch::nn::Linear a(6, 6), b(6, 6);
  auto layer_a = a.ptr(), layer_b = b.ptr();
  auto forward = [&](const at::Tensor& in) {
    auto h = cpprun::checkpoint([layer_a](const at::Tensor& t) { return torch::tanh(layer_a->forward(t)); }, in);
    return layer_b->forward(h);
  };
  std::vector<at::Tensor> params = a->parameters();
  for (const auto& p : b->parameters()) params.push_back(p);
  check_split_matches_whole(forward, params, torch::randn({4, 6}), /*expect_split=*/true);
}

TEST_CASE("split backward: a tensor hook at a weight's meeting node runs once, as in one backward", "[pipeline]") {
  // The weight pass started the engine at the node whose output carries the hook, which ran it
  // again: a hook doubling the pre-activation's gradient doubled the layer's weight gradient twice.
  DoubleByDefault doubles;
  torch::manual_seed(5);
  torch::nn::Linear a(6, 6), b(6, 3);
  std::vector<at::Tensor> params = a->parameters();
  for (const auto& p : b->parameters()) params.push_back(p);
  int calls = 0;
  at::Tensor retained;
  auto forward = [&](const at::Tensor& in) {
    auto h = a->forward(in);
    h.register_hook([&calls](const at::Tensor& g) {
      ++calls;
      return g * 2;
    });
    h.retain_grad();
    retained = h;
    return b->forward(torch::tanh(h));
  };
  check_split_matches_whole(forward, params, torch::randn({4, 6}), /*expect_split=*/true);
  CHECK(calls == 2);  // once in the whole backward, once in the split one
  // retain_grad's hook runs once too: the pre-activation's gradient is the hooked one, not twice it.
  zero(params);
  const auto x = torch::randn({4, 6});
  auto input = x.detach().requires_grad_(true);
  forward(input).sum().backward();
  const auto whole = retained.grad().clone();
  zero(params);
  input = x.detach().requires_grad_(true);
  SplitBackward parts({forward(input).sum()}, {}, input, params);
  parts.backward_weights();
  CHECK(torch::allclose(retained.grad(), whole, 1e-12, 1e-14));
}
