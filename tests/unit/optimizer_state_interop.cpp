// The C++ side of optimizer_state_interop.sh: an AdamW's state, saved by cpprun beside its model,
// continues training in PyTorch, and PyTorch's continues in cpprun, to the same parameters.
//
//   optimizer_state_interop write DIR    trains 3 AdamW steps on DIR/batches.safetensors' batches 0-2,
//                                        saves DIR/ckpt/ (model and optimizer, one save id) and
//                                        get_optimizer_state_dict's dict (torch::pickle_save, which
//                                        torch.load reads as a dict of tensors and Python values) to
//                                        DIR/inmem.pt, steps on batch 3 and writes the parameters then to
//                                        DIR/cpp_next.safetensors
//   optimizer_state_interop resume DIR   loads DIR/py/model.safetensors and DIR/py/optimizer.safetensors
//                                        (PyTorch's), steps on batch 3, compares with DIR/py_next.safetensors
//   optimizer_state_interop tied DIR     a model whose head.weight is emb.weight: one AdamW step, then
//                                        save_async(model, optimizer) to DIR/tied/{model,optimizer}.safetensors,
//                                        one more step, its parameters to DIR/tied_next.safetensors
#include <torch/torch.h>

#include <algorithm>
#include <fstream>
#include <iostream>
#include <map>
#include <string>

#include "cpprun/optimizer_state_dict.h"
#include "cpprun/state_dict.h"
#include "cpprun/unique_parameters.h"

namespace {

// optimizer_state_interop.py's Net.
struct Net : torch::nn::Module {
  torch::nn::Linear fc1 = register_module("fc1", torch::nn::Linear(8, 13));
  torch::nn::Linear fc2 = register_module("fc2", torch::nn::Linear(13, 4));
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::tanh(fc1(x))); }
};

// The four batches Python wrote: x0..x3 [12, 8], y0..y3 [12, 4].
std::map<std::string, torch::Tensor> read_batches(const std::string& path) {
  torch::nn::Module holder;
  std::map<std::string, torch::Tensor> out;
  for (int s = 0; s < 4; ++s) {
    const auto n = std::to_string(s);
    out["x" + n] = holder.register_buffer("x" + n, torch::zeros({12, 8}));
    out["y" + n] = holder.register_buffer("y" + n, torch::zeros({12, 4}));
  }
  cpprun::load_state_dict(holder, path);
  return out;
}

void step(Net& net, torch::optim::Optimizer& opt, std::map<std::string, torch::Tensor>& batches, int s) {
  opt.zero_grad();
  const auto n = std::to_string(s);
  torch::mse_loss(net.forward(batches.at("x" + n)), batches.at("y" + n)).backward();
  opt.step();
}

// optimizer_state_interop.py's TiedNet: the output layer is the embedding.
struct TiedNet : torch::nn::Module {
  torch::nn::Embedding emb = register_module("emb", torch::nn::Embedding(6, 4));
  torch::nn::Linear mid = register_module("mid", torch::nn::Linear(4, 4));
  std::shared_ptr<torch::nn::Module> head = register_module("head", std::make_shared<torch::nn::Module>());
  torch::Tensor head_weight = head->register_parameter("weight", emb->weight);
  torch::Tensor forward(const torch::Tensor& ids) { return torch::matmul(mid(emb(ids)), head_weight.t()); }
};

int tied(const std::string& dir) {
  torch::manual_seed(3);
  auto net = std::make_shared<TiedNet>();
  torch::optim::AdamW opt(cpprun::unique_parameters(*net), torch::optim::AdamWOptions(0.01));
  const auto ids = torch::tensor({1, 2, 5, 0}, torch::kLong);
  const auto tied_step = [&] {
    opt.zero_grad();
    net->forward(ids).square().mean().backward();
    opt.step();
  };
  tied_step();
  cpprun::save_async(net, opt, dir + "/tied/model.safetensors", dir + "/tied/optimizer.safetensors").wait();
  tied_step();
  cpprun::save_state_dict(net, dir + "/tied_next.safetensors");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: optimizer_state_interop write|resume|tied DIR\n";
    return 2;
  }
  const std::string mode = argv[1], dir = argv[2];
  if (mode == "tied") return tied(dir);
  auto batches = read_batches(dir + "/batches.safetensors");
  auto net = std::make_shared<Net>();
  torch::optim::AdamW opt(net->parameters(), torch::optim::AdamWOptions(0.01).weight_decay(0.05));
  if (mode == "write") {
    cpprun::load_state_dict(net, dir + "/init.safetensors");
    for (int s = 0; s < 3; ++s) step(*net, opt, batches, s);
    const auto options = cpprun::StateDictSaveOptions().step(3).save_id(cpprun::new_save_id());
    cpprun::save_state_dict(net, dir + "/ckpt/", options);
    cpprun::save_optimizer_state_dict(net, opt, dir + "/ckpt/", options);
    c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
    for (const auto& item : cpprun::get_optimizer_state_dict(net, opt)) dict.insert(item.key(), item.value());
    const std::vector<char> bytes = torch::pickle_save(dict);
    std::ofstream(dir + "/inmem.pt", std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    step(*net, opt, batches, 3);
    cpprun::save_state_dict(net, dir + "/cpp_next.safetensors");
    return 0;
  }
  // resume: PyTorch's files; lr 0.5 here, the file's (0.01) must win.
  torch::optim::AdamW fresh(net->parameters(), torch::optim::AdamWOptions(0.5));
  cpprun::load_state_dict(net, dir + "/py/model.safetensors");
  cpprun::load_optimizer_state_dict(net, fresh, dir + "/py/optimizer.safetensors");
  step(*net, fresh, batches, 3);
  Net expected;
  cpprun::load_state_dict(expected, dir + "/py_next.safetensors");
  auto want = expected.named_parameters();
  double worst = 0;
  for (const auto& item : net->named_parameters()) {
    worst = std::max(worst, (item.value() - want[item.key()]).abs().max().item<double>());
  }
  std::cout << "cpprun's step from PyTorch's AdamW state: max difference " << worst << "\n";
  return worst <= 1e-6 ? 0 : 1;
}
