// Small models and data shared by the DDP tests.
#pragma once

#include <torch/torch.h>

namespace ddp_test {

struct Mlp : torch::nn::Module {
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
  explicit Mlp(int64_t hidden = 32) {
    fc1 = register_module("fc1", torch::nn::Linear(10, hidden));
    fc2 = register_module("fc2", torch::nn::Linear(hidden, hidden));
    fc3 = register_module("fc3", torch::nn::Linear(hidden, 4));
  }
  torch::Tensor forward(torch::Tensor x) {
    return fc3(torch::relu(fc2(torch::relu(fc1(x)))));
  }
};

// Conv + BatchNorm: the buffers (running statistics) are what DDP broadcasts from rank 0. The
// convolutions have no bias, as usual before BatchNorm: it would get a zero gradient (BatchNorm
// subtracts the mean), i.e. only rounding noise, which Adam would scale up to full steps.
struct SmallCnn : torch::nn::Module {
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr}, bn2{nullptr};
  torch::nn::Linear head{nullptr};
  SmallCnn() {
    conv1 = register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 4, 3).padding(1).bias(false)));
    bn1 = register_module("bn1", torch::nn::BatchNorm2d(4));
    conv2 = register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(4, 8, 3).padding(1).bias(false)));
    bn2 = register_module("bn2", torch::nn::BatchNorm2d(8));
    head = register_module("head", torch::nn::Linear(8 * 4 * 4, 4));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::max_pool2d(torch::relu(bn1(conv1(x))), 2);
    x = torch::max_pool2d(torch::relu(bn2(conv2(x))), 2);
    return head(x.flatten(1));
  }
};

// FSDP's wrap policy of one unit per Linear, which the FSDP and HSDP tests share.
inline bool is_linear(const torch::nn::Module& m) { return dynamic_cast<const torch::nn::LinearImpl*>(&m) != nullptr; }

// Deterministic data: the same on every rank, so each can slice out its part.
inline torch::Tensor inputs_for(const std::string& model, int64_t n, int64_t step) {
  torch::manual_seed(1000 + step);
  return model == "cnn" ? torch::randn({n, 1, 16, 16}) : torch::randn({n, 10});
}
inline torch::Tensor targets_for(int64_t n, int64_t step) {
  torch::manual_seed(2000 + step);
  return torch::randint(0, 4, {n}, torch::kLong);
}

// Copies every parameter and buffer of `from` into `to` (same architecture).
inline void copy_state(torch::nn::Module& to, const torch::nn::Module& from) {
  torch::NoGradGuard no_grad;
  auto dst = to.named_parameters(), src = from.named_parameters();
  for (const auto& item : src) dst[item.key()].copy_(item.value());
  auto dst_b = to.named_buffers(), src_b = from.named_buffers();
  for (const auto& item : src_b) dst_b[item.key()].copy_(item.value());
}

// Largest |a - b| / max(|b|, 1e-3)... as a relative error over the whole tensor.
inline double relative_difference(const torch::Tensor& a, const torch::Tensor& b) {
  auto diff = (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>();
  auto scale = std::max(b.to(torch::kDouble).abs().max().item<double>(), 1e-6);
  return diff / scale;
}

}  // namespace ddp_test

namespace ddp_test {

// A model whose forward may skip a branch (used on some ranks only) and never uses `unused`.
struct Branchy : torch::nn::Module {
  torch::nn::Linear trunk{nullptr}, branch{nullptr}, unused{nullptr}, head{nullptr};
  Branchy() {
    trunk = register_module("trunk", torch::nn::Linear(10, 16));
    branch = register_module("branch", torch::nn::Linear(16, 16));
    unused = register_module("unused", torch::nn::Linear(16, 16));
    head = register_module("head", torch::nn::Linear(16, 4));
  }
  torch::Tensor forward(torch::Tensor x, bool use_branch) {
    auto h = torch::relu(trunk(x));
    if (use_branch) h = h + torch::relu(branch(h));
    return head(h);
  }
};

// Parameters of two dtypes, float32 and float64 (whatever the default dtype): buckets must never
// mix them. Takes inputs of either; returns float64.
struct MixedPrecisionMlp : torch::nn::Module {
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  MixedPrecisionMlp() {
    fc1 = register_module("fc1", torch::nn::Linear(10, 32));
    fc2 = register_module("fc2", torch::nn::Linear(32, 4));
    fc1->to(torch::kFloat);
    fc2->to(torch::kDouble);
  }
  torch::Tensor forward(torch::Tensor x) {
    return fc2(torch::relu(fc1(x.to(torch::kFloat))).to(torch::kDouble));
  }
};

}  // namespace ddp_test
