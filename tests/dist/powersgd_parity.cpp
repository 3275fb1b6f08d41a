// The C++ side of powersgd_parity.sh: cpprun's DDP with cpprun::powerSGD_hook trains what
// powersgd_parity.py trains with PyTorch's, from DIR/init.safetensors on DIR/batches.safetensors;
// rank 0 writes DIR/cpp_CONFIG.safetensors.
//   cpprun --nproc_per_node=2 powersgd_parity DIR CONFIG
#include <torch/torch.h>

#include <cstdio>
#include <map>
#include <string>

#include "cpprun/cpprun.h"
#include "interop_files.h"

namespace {

constexpr int kSteps = 6;

// powersgd_parity.py's CONFIGS, the same.
const std::map<std::string, cpprun::PowerSGDOptions> kConfigs{
    {"rank1", cpprun::PowerSGDOptions().matrix_approximation_rank(1).start_powerSGD_iter(2)},
    {"qr_cold", cpprun::PowerSGDOptions().matrix_approximation_rank(3).start_powerSGD_iter(3).min_compression_rate(1)
                    .warm_start(false)},
    {"batched", cpprun::PowerSGDOptions().matrix_approximation_rank(2).start_powerSGD_iter(2)
                    .batch_tensors_with_same_shape(true).orthogonalization_epsilon(1e-8).random_seed(7)},
    {"no_feedback", cpprun::PowerSGDOptions().matrix_approximation_rank(1).start_powerSGD_iter(1)
                        .use_error_feedback(false).warm_start(false).random_seed(3)},
};

torch::nn::Sequential net() {
  torch::nn::Sequential model(torch::nn::Linear(8, 16), torch::nn::Tanh(), torch::nn::Linear(16, 16), torch::nn::Tanh(),
                              torch::nn::Linear(16, 16), torch::nn::Tanh(), torch::nn::Linear(16, 4));
  model->to(torch::kDouble);
  return model;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 || kConfigs.count(argv[2]) == 0) {
    std::fprintf(stderr, "usage: cpprun --nproc_per_node=2 powersgd_parity DIR rank1|qr_cold|batched|no_feedback\n");
    return 2;
  }
  const std::string dir = argv[1], config = argv[2];
  auto group = cpprun::init_process_group();
  auto model = net();
  cpprun::load_state_dict(model, dir + "/init.safetensors");
  auto ddp = cpprun::DistributedDataParallel(model.ptr(), group);
  ddp->register_comm_hook(cpprun::powerSGD_hook(kConfigs.at(config)));
  torch::optim::SGD opt(ddp->parameters(), 0.1);
  const auto batches = interop::read_tensors(dir + "/batches.safetensors");
  const std::string r = std::to_string(group.rank());
  for (int s = 0; s < kSteps; ++s) {
    opt.zero_grad();
    const std::string at = r + "_" + std::to_string(s);
    torch::mse_loss(ddp->forward(batches.at("x" + at)), batches.at("y" + at)).backward();
    opt.step();
  }
  if (group.rank() == 0) cpprun::save_state_dict(model, dir + "/cpp_" + config + ".safetensors");
  cpprun::barrier(group);
  return 0;
}
