// The C++ side of pipeline_pytorch_parity.sh: cpprun's pipeline schedules train what
// pipeline_pytorch_parity.py trains with PyTorch's torch.distributed.pipelining, the same
// Sequential cut into the same stages, from DIR/init.safetensors on DIR/batches.safetensors; each
// rank writes its stages' parameters (and the last stage's rank the losses) to
// DIR/cpp_SCHEDULE_r{RANK}.safetensors.
//   cpprun --nproc_per_node=2 pipeline_pytorch_parity DIR gpipe|1f1b|zero-bubble|interleaved-1f1b|interleaved-odd|looped-bfs
#include <torch/torch.h>

#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cpprun/cpprun.h"
#include "interop_files.h"

namespace {

constexpr int kSteps = 3;
struct Config {
  std::string schedule;
  int stages_per_rank, microbatches;
};
// pipeline_pytorch_parity.py's CONFIGS, the same.
const std::map<std::string, Config> kConfigs{{"gpipe", {"gpipe", 1, 4}},
                                             {"1f1b", {"1f1b", 1, 4}},
                                             {"zero-bubble", {"zero-bubble", 1, 4}},
                                             {"interleaved-1f1b", {"interleaved-1f1b", 2, 4}},
                                             {"interleaved-odd", {"interleaved-1f1b", 2, 3}},
                                             {"looped-bfs", {"looped-bfs", 2, 4}}};

// pipeline_pytorch_parity.py's net(): children "0" to "7".
torch::nn::Sequential net() {
  torch::nn::Sequential model(torch::nn::Linear(8, 16), torch::nn::Tanh(), torch::nn::Linear(16, 16),
                              torch::nn::Tanh(), torch::nn::Linear(16, 16), torch::nn::Tanh(),
                              torch::nn::Linear(16, 16), torch::nn::Linear(16, 4));
  model->to(torch::kDouble);
  return model;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 || kConfigs.count(argv[2]) == 0) {
    std::fprintf(stderr, "usage: cpprun --nproc_per_node=2 pipeline_pytorch_parity DIR "
                         "gpipe|1f1b|zero-bubble|interleaved-1f1b|interleaved-odd|looped-bfs\n");
    return 2;
  }
  const std::string dir = argv[1], name = argv[2];
  auto group = cpprun::init_process_group();
  auto model = net();
  cpprun::load_state_dict(model, dir + "/init.safetensors");
  const Config& config = kConfigs.at(name);
  const int per_rank = config.stages_per_rank, ranks = group.size();
  const cpprun::PipelineSplit split = cpprun::split_evenly(model, ranks * per_rank);
  std::vector<std::unique_ptr<cpprun::PipelineStage>> owned;
  std::vector<cpprun::PipelineStage*> stages;
  for (int k = 0; k < per_rank; ++k) {
    owned.push_back(std::make_unique<cpprun::PipelineStage>(model, split, group, group.rank() + k * ranks));
    stages.push_back(owned.back().get());
  }
  auto schedule = cpprun::make_schedule(config.schedule, stages, config.microbatches,
                                        [](const at::Tensor& output, const at::Tensor& target) {
                                          return torch::mse_loss(output, target);
                                        });
  std::vector<at::Tensor> parameters;
  for (auto* stage : stages) {
    for (const auto& p : stage->parameters()) parameters.push_back(p);
  }
  torch::optim::SGD opt(parameters, torch::optim::SGDOptions(0.1).momentum(0.9));
  const auto batches = interop::read_tensors(dir + "/batches.safetensors");
  std::vector<double> losses;
  for (int s = 0; s < kSteps; ++s) {
    opt.zero_grad();
    const std::string at = std::to_string(s);
    losses.push_back(schedule->step(batches.at("x" + at), batches.at("y" + at)).item<double>());
    opt.step();
  }
  cpprun::detail::NamedTensors mine;
  bool last = false;
  for (auto* stage : stages) {
    last = last || stage->is_last();
    for (const auto& child : split[stage->index()]) {
      for (const auto& p : model->named_children()[child]->named_parameters()) mine.emplace_back(child + "." + p.key(), p.value());
    }
  }
  if (last) mine.emplace_back("losses", torch::tensor(losses, torch::kDouble));
  const std::string path = dir + "/cpp_" + name + "_r" + std::to_string(group.rank()) + ".safetensors";
  interop::write_tensors(path, mine);
  cpprun::barrier(group);
  return 0;
}
