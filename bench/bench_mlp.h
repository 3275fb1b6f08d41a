// The benchmarks' model: MLP 1024-[hidden x 4]-10 (4.2M parameters at hidden 1024, 25M at 2720),
// one Linear per unit under FSDP. Shared so that dp_bench's, fsdp_memory's and async_save_bench's
// figures measure the same model.
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

// A LoRA-style fine-tune's base (dp_bench and fsdp_memory's --frozen 1): every Linear's weight but
// the last frozen (requires_grad false, 4.19M of 4.21M parameters at hidden 1024), the biases and
// the head trained. bench/dp_bench.py and bench/fsdp_memory.py freeze the same tensors.
inline void freeze_all_weights_but_the_head(torch::nn::Sequential& net) {
  for (std::size_t i = 0; i + 1 < net->size(); ++i) {
    if (auto* linear = net[i]->as<torch::nn::Linear>()) linear->weight.requires_grad_(false);
  }
}

}  // namespace bench
