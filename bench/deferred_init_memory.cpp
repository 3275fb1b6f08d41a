// Peak per-rank memory of model state (parameters, gradients, and AdamW's two moments: 16 bytes a
// parameter in fp32, or plain SGD's none: 8 bytes) from building the model to the end of 3
// training steps, for DDP, ZeRO-3 of a
// model built eagerly (every rank builds it whole, then FSDP shards it) and ZeRO-3 of a model
// built with cpprun::deferred_init (FSDP materialises one unit at a time). Measured as the peak
// resident memory over the size before the model is built, after the same mode has run once on a
// tiny model (threads, pools and communication buffers exist by then). Run by
// scripts/bench_deferred_init.sh.
//
//   cpprun --nproc_per_node=4 build/bench/deferred_init_memory --mode ddp|zero3-eager|zero3-deferred
//          [--layers 32] [--width 1024] [--optimizer adamw|sgd]
#include <cpprun/cpprun.h>
#include <torch/torch.h>

#include <cstdio>
#include <memory>
#include <string>

#include "peak_rss.h"

namespace {

torch::nn::Sequential make_model(int64_t width, int64_t layers) {
  torch::nn::Sequential net;
  for (int64_t i = 0; i < layers; ++i) {
    net->push_back(torch::nn::Linear(width, width));
    net->push_back(torch::nn::ReLU());
  }
  return net;
}

bool is_linear(const torch::nn::Module& m) { return dynamic_cast<const torch::nn::LinearImpl*>(&m) != nullptr; }

void train(const std::string& mode, const std::string& optimizer, int64_t width, int64_t layers,
           const cpprun::ProcessGroup& group) {
  torch::manual_seed(0);
  const bool deferred = mode == "zero3-deferred";
  auto net = deferred ? cpprun::deferred_init([&] { return make_model(width, layers); }) : make_model(width, layers);
  auto x = torch::randn({8, width});
  auto steps = [&](auto& model) {
    std::unique_ptr<torch::optim::Optimizer> opt;
    if (optimizer == "sgd") opt = std::make_unique<torch::optim::SGD>(model->parameters(), 1e-3);
    else opt = std::make_unique<torch::optim::AdamW>(model->parameters(), 1e-4);
    for (int s = 0; s < 3; ++s) {
      opt->zero_grad();
      model->forward(x).pow(2).mean().backward();
      opt->step();
    }
  };
  if (mode == "ddp") {
    auto ddp = cpprun::DistributedDataParallel(net.ptr(), group, cpprun::DdpOptions().gradient_as_bucket_view(true));
    steps(ddp);
  } else {
    auto fsdp = cpprun::FullyShardedDataParallel(net.ptr(), group, cpprun::FsdpOptions().stage(3).wrap_policy(is_linear));
    steps(fsdp);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = "ddp", optimizer = "adamw";
  int64_t layers = 32, width = 1024;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--mode") mode = v;
    else if (k == "--layers") layers = std::stoll(v);
    else if (k == "--width") width = std::stoll(v);
    else if (k == "--optimizer") optimizer = v;
    else throw std::invalid_argument("unknown flag " + k + " (--mode ddp|zero3-eager|zero3-deferred, --layers, --width, "
                                  "--optimizer adamw|sgd)");
  }
  if (mode != "ddp" && mode != "zero3-eager" && mode != "zero3-deferred") {
    throw std::invalid_argument("--mode must be ddp, zero3-eager or zero3-deferred, got " + mode);
  }
  torch::set_num_threads(1);
  auto group = cpprun::init_process_group();
  train(mode, optimizer, 16, 2, group);  // warm-up: threads, pools, communication buffers
  bench::reset_peak_rss();
  const int64_t before = bench::peak_rss();
  train(mode, optimizer, width, layers, group);
  const int64_t growth = bench::peak_rss() - before;
  // The largest rank's figure.
  auto worst = torch::tensor({static_cast<double>(growth)}, torch::kDouble);
  cpprun::all_reduce(group, worst, cpprun::ReduceOp::kMax);
  if (group.rank() == 0) {
    const int64_t psi = layers * (width * width + width);
    std::printf("RESULT mode=%s optimizer=%s world=%d psi=%lld unit_params=%lld peak_growth=%lld\n", mode.c_str(), optimizer.c_str(), group.size(),
                static_cast<long long>(psi), static_cast<long long>(width * width + width),
                static_cast<long long>(worst.item<double>()));
  }
}
