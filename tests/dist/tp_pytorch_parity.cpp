// The C++ side of tp_pytorch_parity.sh: cpprun's tensor parallelism trains what
// tp_pytorch_parity.py trains with PyTorch's (DTensor), the same Sequential under the same plan,
// from DIR/init.safetensors on DIR/batches.safetensors; rank 0 writes DIR/cpp_PLAN.safetensors
// (the full parameters, gathered, and the losses of every step).
//   cpprun --nproc_per_node=2 tp_pytorch_parity DIR megatron|sequence
#include <torch/torch.h>

#include <cstdio>
#include <map>
#include <string>

#include "cpprun/cpprun.h"
#include "interop_files.h"

namespace {

constexpr int kSteps = 5, kVocab = 32, kWidth = 16, kHidden = 32;

// tp_pytorch_parity.py's net(): children "0" to "6".
torch::nn::Sequential net() {
  torch::nn::Sequential model(torch::nn::Embedding(kVocab, kWidth),
                              torch::nn::LayerNorm(torch::nn::LayerNormOptions({kWidth})),
                              torch::nn::Linear(kWidth, kHidden), torch::nn::GELU(), torch::nn::Linear(kHidden, kWidth),
                              torch::nn::LayerNorm(torch::nn::LayerNormOptions({kWidth})),
                              torch::nn::Linear(kWidth, kVocab));
  model->to(torch::kDouble);
  return model;
}

// tp_pytorch_parity.py's plan(NAME), the same styles with the same layouts.
cpprun::ParallelizePlan plan(const std::string& name) {
  using cpprun::ColwiseParallel, cpprun::RowwiseParallel, cpprun::Replicate, cpprun::Shard;
  if (name == "megatron") {
    return {{"0", ColwiseParallel().output_layouts(Replicate())},
            {"2", ColwiseParallel()},
            {"4", RowwiseParallel()},
            {"6", ColwiseParallel().output_layouts(Replicate())}};
  }
  return {{"0", RowwiseParallel().input_layouts(Replicate()).output_layouts(Shard(1))},
          {"1", cpprun::SequenceParallel()},
          {"2", ColwiseParallel().input_layouts(Shard(1))},
          {"4", RowwiseParallel().output_layouts(Shard(1))},
          {"5", cpprun::SequenceParallel()},
          {"6", ColwiseParallel().input_layouts(Shard(1)).output_layouts(Replicate())}};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 || (std::string(argv[2]) != "megatron" && std::string(argv[2]) != "sequence")) {
    std::fprintf(stderr, "usage: cpprun --nproc_per_node=2 tp_pytorch_parity DIR megatron|sequence\n");
    return 2;
  }
  const std::string dir = argv[1], name = argv[2];
  auto group = cpprun::init_process_group();
  auto model = net();
  cpprun::load_state_dict(model, dir + "/init.safetensors");
  cpprun::parallelize_module(model.ptr(), group, plan(name));
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
  const auto batches = interop::read_tensors(dir + "/batches.safetensors");
  std::vector<double> losses;
  for (int s = 0; s < kSteps; ++s) {
    opt.zero_grad();
    const std::string at = std::to_string(s);
    const torch::Tensor logits = model->forward(batches.at("x" + at));
    torch::Tensor loss = torch::cross_entropy_loss(logits.flatten(0, 1), batches.at("y" + at).flatten());
    loss.backward();
    opt.step();
    losses.push_back(loss.item<double>());
  }
  cpprun::detail::NamedTensors full;
  for (const auto& item : cpprun::tensor_parallel_full_state_dict(*model)) full.emplace_back(item.key(), item.value());
  full.emplace_back("losses", torch::tensor(losses, torch::kDouble));
  const std::string path = dir + "/cpp_" + name + ".safetensors";
  if (group.rank() == 0) interop::write_tensors(path, full);
  cpprun::barrier(group);
  return 0;
}
