// The C++ side of clip_parity.sh: DDP on 2 ranks clips a float32 MLP's gradients, and so does
// cpprun::clip_grad_norm_ on a plain module; rank 0 writes, per case, the gradients before and
// after and the norm returned, for clip_parity.py to compare with Python's
// torch.nn.utils.clip_grad_norm_ on the same gradients (to the bit).
//   cpprun --nproc_per_node=2 clip_parity DIR
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/state_dict.h"
#include "cpprun/cpprun.h"

namespace {

struct Net : torch::nn::Module {
  torch::nn::Linear fc1 = register_module("fc1", torch::nn::Linear(8, 32));
  torch::nn::Linear fc2 = register_module("fc2", torch::nn::Linear(32, 16));
  torch::nn::Linear fc3 = register_module("fc3", torch::nn::Linear(16, 4));
  // Mixed: fc2 in bfloat16, so the gradients come in two dtypes, which PyTorch groups and stacks
  // in the order of its own map, not the order they first appear.
  explicit Net(bool mixed = false) : mixed(mixed) {
    if (mixed) fc2->to(torch::kBFloat16);
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = torch::tanh(fc1(x));
    h = mixed ? fc2(h.to(torch::kBFloat16)).to(torch::kFloat) : fc2(h);
    return fc3(torch::tanh(h));
  }
  bool mixed;
};

struct Case {
  double max_norm;
  double norm_type;
  double input_scale = 10;  // another scale, another norm: the coefficient's rounding varies with it
};

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && std::string(argv[1]) == "--torch-version") {  // the LibTorch compared with
    std::printf("%d.%d.%d\n", TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR, TORCH_VERSION_PATCH);
    return 0;
  }
  if (argc != 2) {
    std::fprintf(stderr, "usage: cpprun --nproc_per_node=2 clip_parity DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  auto group = cpprun::init_process_group();
  const double inf = std::numeric_limits<double>::infinity();
  // Clipping with each norm, and a max_norm no gradient reaches (multiplied by 1); then norms of
  // many sizes: Python's max_norm / total is total.reciprocal() * max_norm, which rounds otherwise
  // than a division for about a quarter of totals, so a division would fail here.
  std::vector<Case> cases{{0.5, 2.0}, {0.5, 1.0}, {0.05, inf}, {0.5, 3.0}, {1e6, 2.0}};
  for (int i = 0; i < 16; ++i) cases.push_back({0.3, 2.0, 5.0 + i});
  int index = 0;
  // Under DDP, a plain module through cpprun::clip_grad_norm_ (rank 0's batch alone), and a
  // plain module of two dtypes.
  enum Mode { kDdp, kPlain, kMixed };
  for (const Mode mode : {kDdp, kPlain, kMixed})
  for (const Case& c : cases) {
    const bool wrapped = mode == kDdp;
    torch::manual_seed(0);
    auto net = std::make_shared<Net>(mode == kMixed);
    torch::manual_seed(100 + group.rank());  // each rank its own batch
    const auto x = torch::randn({16, 8}) * c.input_scale, y = torch::randn({16, 4});
    std::optional<cpprun::DistributedDataParallel<Net>> model;
    if (wrapped) model.emplace(net, group);
    torch::mse_loss(wrapped ? (*model)->forward(x) : net->forward(x), y).backward();
    cpprun::detail::NamedTensors state;
    const auto params = net->named_parameters();
    // Each gradient as it is now, under "WHEN.NNN.name": the parameters' order, kept by sorted names.
    const auto record = [&](const std::string& when) {
      for (size_t i = 0; i < params.size(); ++i) {
        char order[8];
        std::snprintf(order, sizeof(order), "%03zu", i);
        state.emplace_back(when + "." + order + "." + params[i].key(), params[i].value().grad().clone());
      }
    };
    record("before");
    const double norm = wrapped ? (*model)->clip_grad_norm(c.max_norm, c.norm_type)
                                : cpprun::clip_grad_norm_(*net, c.max_norm, c.norm_type);
    record("after");
    state.emplace_back("norm", torch::tensor(norm, torch::kDouble));
    state.emplace_back("max_norm", torch::tensor(c.max_norm, torch::kDouble));
    state.emplace_back("norm_type", torch::tensor(c.norm_type, torch::kDouble));
    if (group.rank() == 0) {
      cpprun::detail::write_state_dict_file(state, dir + "/case" + std::to_string(index) + ".safetensors",
                                            cpprun::StateDictSaveOptions(), {});
      std::printf("case %d (%s): max_norm %g, norm_type %g, inputs x%g: norm %.9g\n", index,
                  mode == kDdp ? "DDP" : mode == kPlain ? "plain" : "plain, float32 and bfloat16", c.max_norm,
                  c.norm_type, c.input_scale, norm);
    }
    ++index;
  }
  cpprun::barrier(group);
  return 0;
}
