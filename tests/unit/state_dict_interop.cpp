// The C++ side of state_dict_interop.sh and hf_sharded_interop.sh: writes the reference model's
// state dict as .pt, .safetensors or a Hugging Face sharded directory, or loads a file or
// directory (from Python) and checks it against the same reference values.
//
//   state_dict_interop write DIR          DIR/cpp.pt, DIR/cpp.safetensors, DIR/cpp_order.txt (the names
//                                         get_model_state_dict lists, one a line, in its order)
//   state_dict_interop write_sharded DIR  under cpprun: FSDP stage 3 saves DIR/ (a file per rank)
//   state_dict_interop read PATH          loads PATH strictly; exit 0 when every value is the reference's
//   state_dict_interop read_ddp PATH      read, with consume_prefix_in_state_dict_if_present("module.")
//   state_dict_interop refuse PATH        loads PATH; prints the error (exit 0) or "loaded" (exit 1), after
//                                         "refused (StateDictMismatchError): " or "refused (CorruptCheckpointError): "
//   state_dict_interop write_dtypes DIR   DIR/cpp_dtypes.pt (every dtype torch.save writes beyond the
//                                         classic ten) and DIR/cpp_dtypes.safetensors (those safetensors names)
//   state_dict_interop dump PATH          each tensor PATH holds: "name dtype shape crc32-of-its-bytes"
#include <torch/torch.h>

#include <fstream>
#include <iostream>
#include <string>

#include "checkpoint/state_dict.h"  // read_state_dict_file: a file's tensors, no module
#include "cpprun/checkpoint_file.h"
#include "cpprun/fsdp.h"
#include "cpprun/process_group.h"
#include "cpprun/state_dict.h"
#include "support/crc32.h"

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

// The dtypes without a legacy torch.save storage class (written with _rebuild_tensor_v3), and the
// complex ones; by name as state_dict_interop.py's DTYPES. The last has no safetensors name.
const std::pair<const char*, torch::ScalarType> kNewerDtypes[] = {
    {"uint16", torch::kUInt16}, {"uint32", torch::kUInt32}, {"uint64", torch::kUInt64},
    {"float8_e4m3fn", torch::kFloat8_e4m3fn}, {"float8_e5m2", torch::kFloat8_e5m2},
    {"float8_e4m3fnuz", torch::kFloat8_e4m3fnuz}, {"float8_e5m2fnuz", torch::kFloat8_e5m2fnuz},
    {"complex64", torch::kComplexFloat}, {"float8_e8m0fnu", torch::kFloat8_e8m0fnu},
    {"complex128", torch::kComplexDouble}};
constexpr std::size_t kSafetensorsNamed = 9;

// Bytes 0, 1, 2, ... (mod 251) as a [2, 3] tensor of `type`: every bit pattern compared as bytes,
// NaN patterns of the float8 types included. state_dict_interop.py's pattern().
torch::Tensor pattern(torch::ScalarType type) {
  const int64_t bytes = 6 * static_cast<int64_t>(c10::elementSize(type));
  return torch::arange(bytes, torch::kLong).remainder(251).to(torch::kByte).view(type).reshape({2, 3});
}

int dump(const std::string& path) {
  for (const auto& [name, tensor] : cpprun::detail::read_state_dict_file(path)) {
    const torch::Tensor bytes = tensor.contiguous();
    std::string shape;
    for (const int64_t size : bytes.sizes()) shape += (shape.empty() ? "" : "x") + std::to_string(size);
    const auto crc = cpprun::detail::crc32(
        std::string_view(static_cast<const char*>(bytes.data_ptr()), bytes.nbytes()));
    std::cout << name << " " << c10::toString(bytes.scalar_type()) << " " << shape << " " << crc << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: state_dict_interop write DIR | write_sharded DIR | read PATH | read_ddp PATH | refuse PATH | "
                 "write_dtypes DIR | dump PATH\n";
    return 2;
  }
  const std::string mode = argv[1];
  const std::string target = argv[2];
  if (mode == "dump") return dump(target);
  if (mode == "write_dtypes") {
    cpprun::detail::NamedTensors all;
    for (const auto& [name, type] : kNewerDtypes) all.emplace_back(name, pattern(type));
    const cpprun::detail::NamedTensors named(all.begin(), all.begin() + kSafetensorsNamed);
    // A lazily conjugated view: written with its conjugation applied (the file has no flag for it).
    all.emplace_back("conj_view", pattern(torch::kComplexFloat).conj());
    cpprun::detail::write_state_dict_file(all, target + "/cpp_dtypes.pt", {}, {});
    cpprun::detail::write_state_dict_file(named, target + "/cpp_dtypes.safetensors", {}, {});
    std::cout << "wrote " << target << "/cpp_dtypes.pt and cpp_dtypes.safetensors\n";
    return 0;
  }
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
    // get_model_state_dict's names, in its order: state_dict_interop.py compares it with Python's.
    std::ofstream order(target + "/cpp_order.txt");
    for (const auto& item : cpprun::get_model_state_dict(net)) order << item.key() << "\n";
    std::cout << "wrote " << target << "/cpp.pt, cpp.safetensors and cpp_order.txt\n";
    return 0;
  }
  const auto options = mode == "read_ddp" ? cpprun::StateDictOptions().consume_prefix_in_state_dict_if_present("module.")
                                          : cpprun::StateDictOptions();
  try {
    try {
      cpprun::load_state_dict(net, target, options);
    } catch (const cpprun::StateDictMismatchError& e) {
      std::cout << (mode == "refuse" ? "refused (StateDictMismatchError): " : "FAIL: ") << e.what() << "\n";
      return mode == "refuse" ? 0 : 1;
    } catch (const cpprun::CorruptCheckpointError& e) {
      std::cout << (mode == "refuse" ? "refused (CorruptCheckpointError): " : "FAIL: ") << e.what() << "\n";
      return mode == "refuse" ? 0 : 1;
    }
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
