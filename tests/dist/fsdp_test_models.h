// Models and sizes shared by the FSDP tests (test_fsdp.cpp, test_fsdp_controls.cpp).
#pragma once

#include <torch/torch.h>

#include <algorithm>

#include "cpprun/unique_parameters.h"

namespace ddp_test {

// For ZeRO-3's scheduling: a root unit with parameters of its own (used first and last in
// forward), three block units, and one block used twice per forward. Hidden 13: root 143 + 56
// elements and blocks of 182, none divisible by 3 or 4.
struct Block : torch::nn::Module {
  torch::nn::Linear mix{nullptr};
  explicit Block(int64_t hidden) { mix = register_module("mix", torch::nn::Linear(hidden, hidden)); }
  torch::Tensor forward(torch::Tensor x) { return x + torch::tanh(mix(x)); }
};
struct Tower : torch::nn::Module {
  torch::nn::Linear in{nullptr}, out{nullptr};
  std::shared_ptr<Block> b0, b1, b2;
  explicit Tower(int64_t hidden = 13) {
    in = register_module("in", torch::nn::Linear(10, hidden));
    b0 = register_module("b0", std::make_shared<Block>(hidden));
    b1 = register_module("b1", std::make_shared<Block>(hidden));
    b2 = register_module("b2", std::make_shared<Block>(hidden));
    out = register_module("out", torch::nn::Linear(hidden, 4));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(in(x));
    x = b1->forward(b2->forward(b1->forward(b0->forward(x))));
    return out(x);
  }
};
inline bool is_block(const torch::nn::Module& m) { return dynamic_cast<const Block*>(&m) != nullptr; }

// Elements of `module`'s parameters each padded to a multiple of `world` rows (dim 0), as FSDP
// lays them out unsharded.
inline int64_t padded_numel(torch::nn::Module& module, int world) {
  int64_t n = 0;
  for (const auto& p : cpprun::unique_parameters(module)) {
    const int64_t rows = p.dim() == 0 ? 1 : p.size(0);
    n += (rows + world - 1) / world * world * (p.numel() / std::max<int64_t>(rows, 1));
  }
  return n;
}

}  // namespace ddp_test
