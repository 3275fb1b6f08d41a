// Deferred initialisation in one process: building allocates nothing, materialize() gives the
// values eager construction gives with the same seed (and leaves the generator where eager
// construction does) for LibTorch's modules, a custom init, buffers and tied weights, in any
// group order; other ops on a deferred tensor fail naming the op.
#include "catch.h"
#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "bench/peak_rss.h"
#include "core/deferred_replay.h"
#include "cpprun/deferred_init.h"

namespace {

// A custom initialisation: torch::empty + normal_, zeros, randn, arange, views filled and copied
// into from deferred temporaries (full, linspace), chained in-place ops, and a buffer.
struct Custom : torch::nn::Module {
  torch::Tensor w, b, gain, steps;
  Custom() {
    w = register_parameter("w", torch::empty({24, 16}));
    b = register_parameter("b", torch::zeros({24}));
    gain = register_parameter("gain", torch::randn({24}));
    steps = register_buffer("steps", torch::arange(0, 24, torch::kLong));
    torch::NoGradGuard no_grad;
    w.normal_(0, 0.02);
    w[3].fill_(1.5);
    w[4].copy_(torch::full({16}, 2.5));
    b.narrow(0, 0, 5).copy_(torch::linspace(-1, 1, 5));
    gain.uniform_(0.5, 1.5).mul_(2);
  }
};

// An embedding whose weight is also the output layer's (GPT's tied head).
struct TiedHead : torch::nn::Module {
  torch::Tensor weight;
  explicit TiedHead(const torch::Tensor& shared) { weight = register_parameter("weight", shared); }
};
struct TiedLm : torch::nn::Module {
  torch::nn::Embedding tokens{nullptr};
  torch::nn::LayerNorm norm{nullptr};
  std::shared_ptr<TiedHead> head;
  TiedLm() {
    tokens = register_module("tokens", torch::nn::Embedding(torch::nn::EmbeddingOptions(50, 12).padding_idx(0)));
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({12})));
    head = register_module("head", std::make_shared<TiedHead>(tokens->weight));
    torch::nn::init::normal_(tokens->weight, 0, 0.02);
  }
};

struct Mixed : torch::nn::Module {
  Mixed() {
    register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 8, 3)));
    register_module("bn", torch::nn::BatchNorm2d(8));
    register_module("fc", torch::nn::Linear(32, 10));
    register_module("emb", torch::nn::Embedding(20, 6));
    register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({6})));
    register_module("custom", std::make_shared<Custom>());
    register_module("tied", std::make_shared<TiedLm>());
  }
};

// Members built by default initialisers, one of them replaced in the constructor: eager
// construction drew the replaced Linear's random numbers too (Note [Dropped draws]).
struct Replaced : torch::nn::Module {
  torch::nn::Linear a{4, 4};
  torch::nn::Linear b{5, 3};
  Replaced() {
    a = register_module("a", torch::nn::Linear(3, 3));
    register_module("b", b);
  }
};

void check_same_state(torch::nn::Module& eager, torch::nn::Module& deferred) {
  const auto a = eager.named_parameters(), b = deferred.named_parameters();
  REQUIRE(a.size() == b.size());
  for (const auto& item : a) {
    INFO(item.key());
    CHECK_FALSE(cpprun::is_deferred(b[item.key()]));
    CHECK(torch::equal(item.value(), b[item.key()]));
  }
  const auto x = eager.named_buffers(), y = deferred.named_buffers();
  REQUIRE(x.size() == y.size());
  for (const auto& item : x) {
    INFO(item.key());
    CHECK(torch::equal(item.value(), y[item.key()]));
  }
}

// Builds `make()` eagerly and deferred (then materialised) from the same seed: same values, and
// the generator ends in the same state.
template <typename Make>
void check_materialize_gives_eager_values(Make make) {
  torch::manual_seed(7);
  auto eager = make();
  const auto eager_next = torch::rand({8});
  torch::manual_seed(7);
  auto deferred = cpprun::deferred_init(make);
  for (const auto& p : deferred->parameters()) CHECK(cpprun::is_deferred(p));
  cpprun::materialize(*deferred);
  CHECK(torch::equal(eager_next, torch::rand({8})));
  check_same_state(*eager, *deferred);
}

}  // namespace

TEST_CASE("deferred_init: building a 1e9-parameter model allocates nothing", "[deferred_init]") {
  bench::reset_peak_rss();
  const int64_t before = bench::peak_rss();
  auto net = cpprun::deferred_init([] {
    auto stack = torch::nn::Sequential();
    for (int i = 0; i < 10; ++i) stack->push_back(torch::nn::Linear(10000, 10000));  // 4 GB of fp32 weights
    return stack;
  });
  int64_t count = 0;
  for (const auto& p : net->parameters()) {
    CHECK(cpprun::is_deferred(p));
    count += p.numel();
  }
  CHECK(count == 10 * (10000 * 10000 + 10000));
  CHECK(net->parameters()[0].sizes() == torch::IntArrayRef({10000, 10000}));
  CHECK(bench::peak_rss() - before < 64 * 1024 * 1024);  // at its peak, not just after
}

TEST_CASE("deferred_init: materialize gives eager values, module by module", "[deferred_init]") {
  SECTION("Linear") { check_materialize_gives_eager_values([] { return torch::nn::Linear(33, 17).ptr(); }); }
  SECTION("Embedding with padding_idx") {
    check_materialize_gives_eager_values(
        [] { return torch::nn::Embedding(torch::nn::EmbeddingOptions(40, 9).padding_idx(3)).ptr(); });
  }
  SECTION("LayerNorm") {
    check_materialize_gives_eager_values([] { return torch::nn::LayerNorm(torch::nn::LayerNormOptions({7, 5})).ptr(); });
  }
  SECTION("Conv2d") {
    check_materialize_gives_eager_values([] { return torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 6, 5)).ptr(); });
  }
  SECTION("BatchNorm2d (buffers)") { check_materialize_gives_eager_values([] { return torch::nn::BatchNorm2d(4).ptr(); }); }
  SECTION("custom init: normal_, zeros, randn, views, copies") {
    check_materialize_gives_eager_values([] { return std::make_shared<Custom>(); });
  }
  SECTION("tied embedding and head") {
    check_materialize_gives_eager_values([] { return std::make_shared<TiedLm>(); });
  }
  SECTION("all of them in one model") { check_materialize_gives_eager_values([] { return std::make_shared<Mixed>(); }); }
}

TEST_CASE("deferred_init: a member replaced in the constructor still draws, as eager construction does",
          "[deferred_init]") {
  // A deferred model thrown away first: its scope is gone, so its draws must not be replayed.
  torch::manual_seed(3);
  { auto unused = cpprun::deferred_init([] { return std::make_shared<Replaced>(); }); }
  check_materialize_gives_eager_values([] { return std::make_shared<Replaced>(); });
  check_materialize_gives_eager_values([] {  // the replaced member inside a submodule
    auto outer = std::make_shared<torch::nn::Module>();
    outer->register_module("first", torch::nn::Linear(2, 2));
    outer->register_module("replaced", std::make_shared<Replaced>());
    return outer;
  });
}

TEST_CASE("deferred_init: the materialised tied module still shares one tensor and trains", "[deferred_init]") {
  auto lm = cpprun::deferred_init([] { return std::make_shared<TiedLm>(); });
  cpprun::materialize(*lm);
  CHECK(lm->head->weight.unsafeGetTensorImpl() == lm->tokens->weight.unsafeGetTensorImpl());
  auto logits = torch::matmul(lm->norm(lm->tokens(torch::tensor({1, 2, 3}))), lm->head->weight.t());
  logits.sum().backward();
  CHECK(lm->tokens->weight.grad().defined());
}

TEST_CASE("deferred_init: groups in any order give eager values (generator states replayed)", "[deferred_init]") {
  auto make = [] { return std::make_shared<Mixed>(); };
  torch::manual_seed(11);
  auto eager = make();
  const auto eager_next = torch::randn({5});
  for (bool reversed : {false, true}) {
    torch::manual_seed(11);
    auto deferred = cpprun::deferred_init(make);
    std::vector<std::vector<at::Tensor>> groups;
    for (const auto& child : deferred->children()) {
      std::vector<at::Tensor> group;
      for (const auto& p : child->parameters()) group.push_back(p);
      for (const auto& b : child->buffers()) group.push_back(b);
      groups.push_back(group);
    }
    if (reversed) std::reverse(groups.begin(), groups.end());
    cpprun::detail::DeferredReplay replay(groups);
    // In construction order the live generator serves; reversed needs the states (and the copy of a
    // deferred temporary in Custom, rebuilt on its own, needs them in both).
    CHECK(replay.used_state_snapshots());
    for (std::size_t g = 0; g < groups.size(); ++g) replay.materialize(g);
    CHECK(torch::equal(eager_next, torch::randn({5})));
    check_same_state(*eager, *deferred);
  }
}

TEST_CASE("deferred_init: groups in construction order draw from the live generator", "[deferred_init]") {
  auto make = [] {  // one at a time: the order of a constructor's arguments' evaluation is unspecified
    torch::nn::Sequential stack;
    stack->push_back(torch::nn::Linear(8, 8));
    stack->push_back(torch::nn::Linear(8, 4));
    stack->push_back(torch::nn::Linear(4, 2));
    return stack.ptr();
  };
  torch::manual_seed(3);
  auto eager = make();
  torch::manual_seed(3);
  auto deferred = cpprun::deferred_init(make);
  std::vector<std::vector<at::Tensor>> groups;
  for (const auto& child : deferred->children()) groups.push_back(child->parameters());
  cpprun::detail::DeferredReplay replay(groups);
  CHECK_FALSE(replay.used_state_snapshots());
  for (std::size_t g = 0; g < groups.size(); ++g) replay.materialize(g);
  check_same_state(*eager, *deferred);
}

TEST_CASE("deferred_init: other ops on a deferred tensor fail, naming the op", "[deferred_init]") {
  auto fc = cpprun::deferred_init([] { return torch::nn::Linear(4, 3); });
  const auto x = torch::ones({2, 4});
  auto message = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const c10::Error& e) {
      return std::string(e.what_without_backtrace());
    }
    return std::string("no error");
  };
  const std::string forward = message([&] { fc(x); });
  // LibTorch's Linear computes with addmm (on the weight's transpose, a view that passes).
  CHECK_THAT(forward, (Catch::Contains("aten::addmm") || Catch::Contains("aten::linear")) &&
                          Catch::Contains("deferred") && Catch::Contains("cpprun::materialize"));
  CHECK_THAT(message([&] { fc->weight.sum(); }), Catch::Contains("aten::sum"));
  CHECK_THAT(message([&] { torch::zeros({3, 4}).copy_(fc->weight); }), Catch::Contains("aten::copy_"));
  CHECK_THAT(message([&] { fc->weight.item(); }), Catch::Contains("deferred"));
  // Inside the scope too, and the scope ends cleanly after the error.
  CHECK_THAT(message([&] { cpprun::deferred_init([] { return torch::ones({3}).exp(); }); }), Catch::Contains("aten::exp"));
  CHECK_FALSE(cpprun::is_deferred(torch::ones({2})));
  cpprun::materialize(*fc);
  CHECK(fc(x).sizes() == torch::IntArrayRef({2, 3}));
}

TEST_CASE("deferred_init: Module::to() on a deferred module converts when it is materialised", "[deferred_init]") {
  auto make = [] { return std::make_shared<TiedLm>(); };
  torch::manual_seed(5);
  auto eager = make();
  eager->to(torch::kDouble);
  const auto eager_next = torch::rand({4});
  torch::manual_seed(5);
  auto deferred = cpprun::deferred_init(make);
  deferred->to(torch::kDouble);
  for (const auto& p : deferred->parameters()) {
    CHECK(cpprun::is_deferred(p));
    CHECK(p.scalar_type() == torch::kDouble);
  }
  CHECK(deferred->head->weight.is_same(deferred->tokens->weight));
  cpprun::materialize(*deferred);
  CHECK(torch::equal(eager_next, torch::rand({4})));
  check_same_state(*eager, *deferred);
}
