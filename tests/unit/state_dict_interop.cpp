// The C++ side of state_dict_interop.sh and hf_sharded_interop.sh: writes the reference model's
// state dict as .pt, .safetensors or a Hugging Face sharded directory, or loads a file or
// directory (from Python) and checks it against the same reference values.
//
//   state_dict_interop write DIR          DIR/cpp.pt, DIR/cpp.safetensors
//   state_dict_interop write_sharded DIR  under cpprun: FSDP stage 3 saves DIR/ (a file per rank)
//   state_dict_interop read PATH          loads PATH strictly; exit 0 when every value is the reference's
//   state_dict_interop refuse PATH        loads PATH; prints the error (exit 0) or "loaded" (exit 1)
#include <torch/torch.h>

#include <iostream>
#include <string>

#include "cpprun/fsdp.h"
#include "cpprun/process_group.h"
#include "cpprun/state_dict.h"

namespace {

// What state_dict_interop.py's Net is: an embedding, a small body, a head tied to the embedding.
struct HeadImpl : torch::nn::Module {
  explicit HeadImpl(const torch::Tensor& embedding) { register_parameter("weight", embedding); }
};
TORCH_MODULE(Head);

struct Net : torch::nn::Module {
  torch::nn::Embedding embed = register_module("embed", torch::nn::Embedding(5, 4));
  torch::nn::Sequential body = register_module(
      "body", torch::nn::Sequential(torch::nn::Linear(4, 3), torch::nn::BatchNorm1d(3)));
  Head head = register_module("head", Head(embed->weight));
  // Other dtypes and shapes: a 0-d, an empty, bf16, float64, int32, bool.
  torch::Tensor scalar = register_buffer("scalar", torch::zeros({}));
  torch::Tensor empty = register_buffer("empty", torch::zeros({0, 4}));
  torch::Tensor half_precision = register_buffer("bf16", torch::zeros({2, 3}, torch::kBFloat16));
  torch::Tensor wide = register_buffer("f64", torch::zeros({3}, torch::kDouble));
  torch::Tensor count = register_buffer("i32", torch::zeros({4}, torch::kInt));
  torch::Tensor flags = register_buffer("flags", torch::zeros({3}, torch::kBool));
};

// The reference values: the k-th name in sorted order holds arange(numel) * 0.25 + k (integers:
// arange(numel) + k), as state_dict_interop.py's reference() computes them.
std::map<std::string, torch::Tensor> reference(Net& net) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& item : net.named_parameters()) out[item.key()] = item.value();
  for (const auto& item : net.named_buffers()) out[item.key()] = item.value();
  int64_t k = 0;
  std::map<std::string, torch::Tensor> values;
  for (const auto& [name, tensor] : out) {
    auto base = torch::arange(tensor.numel(), torch::kDouble);
    if (tensor.is_floating_point()) base = base * 0.25;
    values[name] = (base + static_cast<double>(k++)).reshape(tensor.sizes()).to(tensor.scalar_type());
  }
  return values;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: state_dict_interop write DIR | write_sharded DIR | read PATH | refuse PATH\n";
    return 2;
  }
  const std::string mode = argv[1];
  const std::string target = argv[2];
  auto net_ptr = std::make_shared<Net>();
  Net& net = *net_ptr;
  const auto values = reference(net);
  if (mode == "write" || mode == "write_sharded") {
    torch::NoGradGuard no_grad;
    // The tied weight is written under both names; its reference is "embed.weight"'s (sorted first).
    for (auto& item : net.named_parameters()) {
      item.value().copy_(values.at(item.key() == "head.weight" ? "embed.weight" : item.key()));
    }
    for (auto& item : net.named_buffers()) item.value().copy_(values.at(item.key()));
  }
  if (mode == "write_sharded") {
    auto group = cpprun::init_process_group();
    auto model = cpprun::FullyShardedDataParallel(net_ptr, group, cpprun::FsdpOptions().stage(3));
    cpprun::save_state_dict(model, target + "/", cpprun::StateDictSaveOptions().step(17));
    if (group.rank() == 0) std::cout << "wrote " << target << "/ on " << group.size() << " ranks\n";
    return 0;
  }
  if (mode == "write") {
    cpprun::save_state_dict(net, target + "/cpp.pt");
    cpprun::save_state_dict(net, target + "/cpp.safetensors");
    std::cout << "wrote " << target << "/cpp.pt and cpp.safetensors\n";
    return 0;
  }
  try {
    cpprun::load_state_dict(net, target);
  } catch (const std::exception& e) {
    std::cout << (mode == "refuse" ? "refused: " : "FAIL: ") << e.what() << "\n";
    return mode == "refuse" ? 0 : 1;
  }
  if (mode == "refuse") {
    std::cout << "FAIL: " << target << " loaded\n";
    return 1;
  }
  int wrong = 0;
  for (const auto& item : net.named_parameters()) {
    const auto& expected = values.at(item.key() == "head.weight" ? "embed.weight" : item.key());
    if (!torch::equal(item.value(), expected)) {
      std::cout << "FAIL: " << item.key() << " differs\n";
      ++wrong;
    }
  }
  for (const auto& item : net.named_buffers()) {
    if (!torch::equal(item.value(), values.at(item.key()))) {
      std::cout << "FAIL: " << item.key() << " differs\n";
      ++wrong;
    }
  }
  if (wrong == 0) std::cout << "loaded " << target << ": every tensor is the reference's\n";
  return wrong == 0 ? 0 : 1;
}
