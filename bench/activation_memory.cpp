// Activation memory of one forward + backward through N residual MLP blocks (width W, hidden 4W,
// GELU, dropout), with and without cpprun::checkpoint around each block. One process: activation
// checkpointing needs no distribution. Prints the peak resident memory growth during the step
// (above the size after the model and input were built), which activations dominate. Run by
// scripts/bench_activation_memory.sh beside bench/activation_memory.py (torch.utils.checkpoint).
//
//   build/bench/activation_memory --blocks 8 --checkpoint 1 [--width 256 --batch 4096]
#include <cpprun/cpprun.h>
#include <torch/torch.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "../examples/flag_value.h"

#include "peak_rss.h"

namespace {


struct Block : torch::nn::Module {
  torch::nn::Linear up{nullptr}, down{nullptr};
  torch::nn::Dropout drop{nullptr};
  explicit Block(int64_t width) {
    up = register_module("up", torch::nn::Linear(width, 4 * width));
    down = register_module("down", torch::nn::Linear(4 * width, width));
    drop = register_module("drop", torch::nn::Dropout(0.1));
  }
  torch::Tensor forward(torch::Tensor x) { return x + drop(down(torch::gelu(up(x)))); }
};

}  // namespace

int main(int argc, char** argv) {
  int64_t blocks = 8, width = 256, batch = 4096;
  bool checkpoint = false;
  try {
    for (examples::Flags flags(argc, argv, "activation_memory"); flags.next();) {
      if (flags.is("--help")) {
        return examples::print_usage("usage: activation_memory [--blocks N (8)] [--width N (256)] [--batch N (4096)] "
                                     "[--checkpoint 0|1 (0)]\n");
      }
      if (flags.is("--blocks")) blocks = flags.number<int64_t>(1);
      else if (flags.is("--width")) width = flags.number<int64_t>(1);
      else if (flags.is("--batch")) batch = flags.number<int64_t>(1);
      else if (flags.is("--checkpoint")) checkpoint = flags.number<int64_t>(0) != 0;
      else flags.unknown();
    }
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "activation_memory: %s\n", e.what());
    return 2;
  }
  torch::set_num_threads(1);
  torch::manual_seed(0);
  std::vector<std::shared_ptr<Block>> stack;
  for (int64_t i = 0; i < blocks; ++i) stack.push_back(std::make_shared<Block>(width));
  auto x = torch::randn({batch, width}).requires_grad_();

  auto run = [&] {
    torch::Tensor h = x;
    for (auto& block : stack) {
      h = checkpoint ? cpprun::checkpoint([block](const torch::Tensor& in) { return block->forward(in); }, h)
                     : block->forward(h);
    }
    h.pow(2).mean().backward();
  };
  run();  // warm-up: parameter gradients exist from here on, as in training
  const int64_t before = bench::peak_rss();
  bench::reset_peak_rss();
  const int64_t base = bench::peak_rss();
  run();
  const int64_t growth = bench::peak_rss() - base;
  // One block's saved activations, in float32: up's output and GELU's (4W each), the dropout
  // mask (W, one byte per element kept as bool) and down's output (W), per sample.
  const double one_block_mb = batch * (4.0 * width * 4 * 2 + width * 4 * 2 + width) / 1e6;
  std::printf("RESULT impl=cpp blocks=%lld checkpoint=%d peak_growth_mb=%.1f one_block_mb=%.1f base_mb=%.1f "
              "before_mb=%.1f\n",
              static_cast<long long>(blocks), checkpoint ? 1 : 0, growth / 1e6, one_block_mb, base / 1e6, before / 1e6);
  return 0;
}
