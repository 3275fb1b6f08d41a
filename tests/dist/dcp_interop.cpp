// The C++ side of dcp_interop.sh: a model and AdamW state that PyTorch saved with
// torch.distributed.checkpoint (converted by scripts/dcp_convert.py) continue training under
// cpprun's FSDP to the parameters PyTorch's own continuation reaches, and cpprun's save continues
// in PyTorch alike. Both sides run 2 ranks, float64, on dcp_interop.py's batches.
//
//   cpprun --nproc_per_node=2 dcp_interop train DIR    from DIR/init.safetensors, kBefore AdamW steps;
//       saves the model and optimizer to DIR/cpp_ckpt/ (one save id), kAfter more steps, and
//       writes the parameters then to DIR/cpp_final.safetensors
//   cpprun --nproc_per_node=2 dcp_interop resume DIR   another seed and lr; loads DIR/from_dcp/
//       (dcp_convert.py to-cpprun of PyTorch's save), kAfter steps, compares the parameters
//       with DIR/py_final.safetensors (PyTorch's own kAfter steps): 1e-10
#include <torch/torch.h>

#include <iostream>
#include <map>
#include <string>

#include "cpprun/cpprun.h"

namespace {

constexpr int kBefore = 3, kAfter = 3;
constexpr int kMicroBatches = 2;  // dcp_interop.py's MICRO_BATCHES
constexpr double kTolerance = 1e-10;

// dcp_interop.py's Net.
struct Net : torch::nn::Module {
  torch::nn::Linear fc1 = register_module("fc1", torch::nn::Linear(8, 16));
  torch::nn::Linear fc2 = register_module("fc2", torch::nn::Linear(16, 4));
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::tanh(fc1(x))); }
};

std::shared_ptr<Net> seeded(int seed) {
  torch::manual_seed(seed);
  auto net = std::make_shared<Net>();
  net->to(torch::kDouble);
  return net;
}

// The batches Python wrote: x0.. [12, 8], y0.. [12, 4], float64.
std::map<std::string, torch::Tensor> read_batches(const std::string& path) {
  torch::nn::Module holder;
  std::map<std::string, torch::Tensor> out;
  for (int s = 0; s < kBefore + kAfter; ++s) {
    const auto n = std::to_string(s);
    out["x" + n] = holder.register_buffer("x" + n, torch::zeros({12, 8}, torch::kDouble));
    out["y" + n] = holder.register_buffer("y" + n, torch::zeros({12, 4}, torch::kDouble));
  }
  cpprun::load_state_dict(holder, path);
  return out;
}

// Step s on this rank's rows of the global batch (FSDP averages the gradients over the ranks), as
// dcp_interop.py's step: kMicroBatches backwards, each reducing its gradients (no no_sync), whose
// shard gradients add up as FSDP2's do.
void step(cpprun::DataParallel<Net>& model, torch::optim::Optimizer& opt, std::map<std::string, torch::Tensor>& batches,
          int s, const cpprun::ProcessGroup& group) {
  const auto n = std::to_string(s);
  const int64_t rows = 12 / group.size(), first = group.rank() * rows;
  opt.zero_grad();
  auto x = batches.at("x" + n).narrow(0, first, rows), y = batches.at("y" + n).narrow(0, first, rows);
  const auto xs = x.chunk(kMicroBatches), ys = y.chunk(kMicroBatches);
  for (size_t m = 0; m < xs.size(); ++m) (torch::mse_loss(model->forward(xs[m]), ys[m]) / kMicroBatches).backward();
  opt.step();
}

bool is_linear(const torch::nn::Module& m) { return m.as<torch::nn::Linear>() != nullptr; }

cpprun::DataParallel<Net> wrap(std::shared_ptr<Net> net, const cpprun::ProcessGroup& group) {
  return cpprun::FullyShardedDataParallel(net, group, cpprun::FsdpOptions().stage(3).wrap_policy(is_linear));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: dcp_interop train|resume DIR\n";
    return 2;
  }
  const std::string mode = argv[1], dir = argv[2];
  const cpprun::ProcessGroup group = cpprun::init_process_group();
  auto batches = read_batches(dir + "/batches.safetensors");
  if (mode == "train") {
    auto net = seeded(1);
    cpprun::load_state_dict(net, dir + "/init.safetensors");
    auto model = wrap(net, group);
    torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(0.01).weight_decay(0.05));
    for (int s = 0; s < kBefore; ++s) step(model, opt, batches, s, group);
    const auto options = cpprun::StateDictSaveOptions().step(kBefore).save_id(cpprun::new_save_id());
    cpprun::save_state_dict(model, dir + "/cpp_ckpt/", options);
    cpprun::save_optimizer_state_dict(model, opt, dir + "/cpp_ckpt/", options);
    for (int s = kBefore; s < kBefore + kAfter; ++s) step(model, opt, batches, s, group);
    cpprun::save_state_dict(model, dir + "/cpp_final.safetensors");
    return 0;
  }
  // resume: PyTorch's state; another seed, and lr 0.5 here: the file's 0.01 must win.
  auto model = wrap(seeded(7), group);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(0.5));
  cpprun::load_state_dict(model, dir + "/from_dcp/");
  cpprun::load_optimizer_state_dict(model, opt, dir + "/from_dcp/");
  const auto& loaded = static_cast<const torch::optim::AdamWOptions&>(opt.param_groups()[0].options());
  if (loaded.lr() != 0.01 || loaded.weight_decay() != 0.05) {
    std::cerr << "FAIL: the loaded options are lr " << loaded.lr() << ", weight_decay " << loaded.weight_decay()
              << ", not PyTorch's 0.01, 0.05\n";
    return 1;
  }
  for (int s = kBefore; s < kBefore + kAfter; ++s) step(model, opt, batches, s, group);
  cpprun::save_state_dict(model, dir + "/cpp_resumed.safetensors");  // rank 0 writes the whole parameters
  if (group.rank() != 0) return 0;
  Net ours, theirs;
  ours.to(torch::kDouble);
  theirs.to(torch::kDouble);
  cpprun::load_state_dict(ours, dir + "/cpp_resumed.safetensors");
  cpprun::load_state_dict(theirs, dir + "/py_final.safetensors");
  auto want = theirs.named_parameters();
  double worst = 0;
  for (const auto& item : ours.named_parameters()) {
    const double d = (item.value() - want[item.key()]).abs().max().item<double>();
    if (!(d <= worst)) worst = d;  // a NaN stays (std::max would drop it)
  }
  std::cout << "cpprun's " << kAfter << " steps from PyTorch's DCP checkpoint against PyTorch's own: max difference "
            << worst << "\n";
  return worst <= kTolerance ? 0 : 1;  // NaN fails
}
