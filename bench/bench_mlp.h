// The benchmarks' model: MLP 1024-[hidden x 4]-10 (4.2M parameters at hidden 1024, 25M at 2720),
// one Linear per unit under FSDP. Shared so that dp_bench's figures and async_save_bench's
// measure the same model.
#pragma once

#include <torch/torch.h>

#include <cstdint>

namespace bench {

inline torch::nn::Sequential make_mlp(int64_t hidden) {
  torch::nn::Sequential net(torch::nn::Linear(1024, hidden), torch::nn::ReLU());
  for (int i = 0; i < 3; ++i) net->push_back(torch::nn::Linear(hidden, hidden)), net->push_back(torch::nn::ReLU());
  net->push_back(torch::nn::Linear(hidden, 10));
  return net;
}

}  // namespace bench
