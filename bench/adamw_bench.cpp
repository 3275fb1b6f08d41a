// AdamW's step time over a GPT's parameter list: LibTorch's torch::optim::AdamW (about ten
// kernels per parameter) against cpprun::FusedAdamW (one fused kernel per group, device and
// dtype). scripts/bench_adamw.sh runs it beside bench/adamw_bench.py (PyTorch's AdamW: fused,
// foreach and for-loop) on the same shapes and prints the ratios.
//
//   adamw_bench [--device cpu|cuda] [--layers L] [--embed C] [--vocab V] [--block T] [--steps N] [--warmup N]
//
// The parameters are GPT-2's tensors at those sizes (default GPT-2 124M: 12, 768, 50304, 1024),
// float32, in train_gpt's two groups (weight decay on 2-D tensors only); the gradients are random
// and fixed. Prints one RESULT line per optimizer: milliseconds per step (the median of --steps,
// each timed after the device finished it), and the largest difference between the two
// optimizers' parameters after the run (their rounding differs in float32, by a few ulps).
#include <cpprun/fused_adamw.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace {

struct Sizes {
  int64_t layers = 12, embed = 768, vocab = 50304, block = 1024;
};

// GPT-2's parameters (train_gpt's order and shapes), the tied head once.
std::vector<std::vector<int64_t>> gpt_shapes(const Sizes& s) {
  const int64_t c = s.embed;
  std::vector<std::vector<int64_t>> shapes{{s.vocab, c}, {s.block, c}};
  for (int64_t l = 0; l < s.layers; ++l) {
    for (auto shape : std::vector<std::vector<int64_t>>{
             {c}, {c}, {c, 3 * c}, {3 * c}, {c, c}, {c}, {c}, {c}, {c, 4 * c}, {4 * c}, {4 * c, c}, {c}}) {
      shapes.push_back(shape);
    }
  }
  shapes.push_back({c});
  shapes.push_back({c});
  return shapes;
}

void sync(const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

}  // namespace

int main(int argc, char** argv) {
  Sizes sizes;
  std::string device_name = "cpu";
  int steps = 20, warmup = 3;
  for (int i = 1; i < argc; ++i) {
    auto value = [&](const char* flag) -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "adamw_bench: %s needs a value\n", flag);
        std::exit(2);
      }
      return argv[++i];
    };
    const std::string flag = argv[i];
    if (flag == "--device") device_name = value("--device");
    else if (flag == "--layers") sizes.layers = std::stoll(value("--layers"));
    else if (flag == "--embed") sizes.embed = std::stoll(value("--embed"));
    else if (flag == "--vocab") sizes.vocab = std::stoll(value("--vocab"));
    else if (flag == "--block") sizes.block = std::stoll(value("--block"));
    else if (flag == "--steps") steps = std::stoi(value("--steps"));
    else if (flag == "--warmup") warmup = std::stoi(value("--warmup"));
    else {
      std::fprintf(stderr, "adamw_bench: unknown option '%s' (--device --layers --embed --vocab --block --steps --warmup)\n",
                   argv[i]);
      return 2;
    }
  }
  if (steps < 1 || warmup < 0) {
    std::fprintf(stderr, "adamw_bench: --steps must be 1 or more and --warmup 0 or more\n");
    return 2;
  }
  const torch::Device device(device_name);
  torch::manual_seed(0);
  const auto shapes = gpt_shapes(sizes);
  std::vector<torch::Tensor> start, grads;
  int64_t numel = 0;
  for (const auto& shape : shapes) {
    start.push_back(torch::randn(shape, torch::TensorOptions().device(device)) * 0.02);
    grads.push_back(torch::randn(shape, torch::TensorOptions().device(device)) * 1e-3);
    numel += start.back().numel();
  }

  std::vector<std::vector<torch::Tensor>> finals;
  for (const std::string impl : {"libtorch", "fused"}) {
    std::vector<torch::Tensor> params, decay, no_decay;
    for (size_t i = 0; i < start.size(); ++i) {
      params.push_back(start[i].clone().requires_grad_());
      params.back().mutable_grad() = grads[i];
      (params.back().dim() >= 2 ? decay : no_decay).push_back(params.back());
    }
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(3e-4).weight_decay(0.1)));
    groups.emplace_back(no_decay, std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(3e-4).weight_decay(0)));
    std::unique_ptr<torch::optim::AdamW> optimizer;
    if (impl == "fused") optimizer = std::make_unique<cpprun::FusedAdamW>(groups, torch::optim::AdamWOptions(3e-4));
    else optimizer = std::make_unique<torch::optim::AdamW>(groups, torch::optim::AdamWOptions(3e-4));
    std::vector<double> ms;
    for (int step = 0; step < warmup + steps; ++step) {
      sync(device);
      const auto t0 = std::chrono::steady_clock::now();
      optimizer->step();
      sync(device);
      if (step >= warmup) ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    finals.push_back(params);
    std::printf("RESULT impl=%s device=%s tensors=%zu params=%lld ms_per_step=%.3f\n", impl.c_str(), device_name.c_str(),
                shapes.size(), static_cast<long long>(numel), ms[ms.size() / 2]);
    std::fflush(stdout);
  }
  double worst = 0;
  for (size_t i = 0; i < start.size(); ++i) {
    worst = std::max(worst, (finals[0][i] - finals[1][i]).abs().max().item<double>());
  }
  std::printf("largest difference between the two after %d steps: %.3g\n", warmup + steps, worst);
  return 0;
}
