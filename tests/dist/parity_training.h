// The training half of the FSDP-style parity tests (several ranks against one process on the same
// global batch): their optimizers and the reference's backward. test_ddp.cpp keeps its own (Adam,
// and BatchNorm buffers restored between slices).
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dist_test_support.h"

namespace ddp_test {

// SGD with momentum, or AdamW with PyTorch's defaults but weight decay. (In float32 these tests
// needed eps 1e-6: AdamW's g / (sqrt(v) + eps) magnified rounding wherever a gradient is ~0. In
// float64, see Note [Parity in float64] in parity_checks.h, the default eps 1e-8 is fine.)
inline std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string& kind,
                                                               std::vector<torch::Tensor> params) {
  if (kind == "sgd") return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.05).momentum(0.9));
  return std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(1e-3).weight_decay(0.01));
}

// The reference's gradients for the whole global batch: the mean of each rank's slice's loss,
// which is what the ranks' averaged gradients correspond to. Slice by slice, so that each forward
// sees the shapes a rank's does. `loss_scale` multiplies each slice's loss (a GradScaler's scale).
inline void reference_backward(const std::function<torch::Tensor(torch::Tensor)>& forward, const torch::Tensor& x,
                               const torch::Tensor& y, int world,
                               const std::function<torch::Tensor(torch::Tensor)>& loss_scale = nullptr) {
  for (int r = 0; r < world; ++r) {
    auto loss = torch::nn::functional::cross_entropy(forward(dist_test::slice(x, r, world)),
                                                     dist_test::slice(y, r, world)) / world;
    (loss_scale ? loss_scale(loss) : loss).backward();
  }
}

}  // namespace ddp_test
