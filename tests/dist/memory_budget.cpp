// The point of ZeRO-3: a model whose training state does not fit one rank's memory trains when
// sharded over 4. Each rank caps its own address space (RLIMIT_AS) at what it uses after start-up
// plus --budget-mb, then builds and trains an MLP of 8 Linear(2048, 2048): Psi = 33.6M
// parameters, so fp32 AdamW needs 16 Psi = 537 MB per rank under DDP (more with its buckets),
// but 16 Psi / 4 = 134 MB plus a few gathered units under ZeRO-3 at 4 ranks.
// With --init deferred the model is built by cpprun::deferred_init and FSDP materialises it one
// unit at a time: a model whose full fp32 parameters alone exceed the budget (64 Linear(1024,
// 1024), 269 MB, plain SGD: 8 Psi / 4 = 134 MB a rank) trains, where building it eagerly fails.
// Prints "fits: ..." or "out of memory: ..." (exit 3), and the model's fp32 parameter bytes.
// Run by memory_budget.sh.
//
//   cpprun --nproc_per_node=4 cpprun_dist_memory_budget --mode zero3|ddp --budget-mb 400
//          [--init eager|deferred] [--layers 8] [--width 2048] [--optimizer adamw|sgd]
#include <malloc.h>
#include <sys/resource.h>

#include <cpprun/cpprun.h>
#include <torch/torch.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

namespace {

int64_t status_kb(const std::string& field) {
  std::ifstream status("/proc/self/status");
  std::string key;
  int64_t kb = 0;
  while (status >> key) {
    if (key == field + ":") {
      status >> kb;
      break;
    }
  }
  return kb;
}

torch::nn::Sequential make_model(int64_t width, int64_t layers) {
  torch::nn::Sequential net;
  for (int i = 0; i < layers; ++i) {
    net->push_back(torch::nn::Linear(width, width));
    if (i + 1 < layers) net->push_back(torch::nn::ReLU());
  }
  return net;
}

bool is_linear(const torch::nn::Module& m) { return dynamic_cast<const torch::nn::LinearImpl*>(&m) != nullptr; }

struct Config {
  std::string mode = "zero3", init = "eager", optimizer = "adamw";
  int64_t budget_mb = 400, width = 2048, layers = 8;
};

torch::nn::Sequential build(const Config& c, int64_t width, int64_t layers) {
  if (c.init == "deferred") return cpprun::deferred_init([&] { return make_model(width, layers); });
  return make_model(width, layers);
}

// A few steps of training `net` wrapped for `mode`; returns the last loss.
double train(const Config& c, torch::nn::Sequential net, const cpprun::ProcessGroup& group, int steps) {
  const std::string& mode = c.mode;
  auto x = torch::randn({8, net[0]->as<torch::nn::Linear>()->options.in_features()});
  auto step_all = [&](auto& model) {
    std::unique_ptr<torch::optim::Optimizer> opt;
    if (c.optimizer == "sgd") opt = std::make_unique<torch::optim::SGD>(model->parameters(), 1e-3);
    else opt = std::make_unique<torch::optim::AdamW>(model->parameters(), 1e-4);
    double loss = 0;
    for (int s = 0; s < steps; ++s) {
      opt->zero_grad();
      auto l = model->forward(x).pow(2).mean();
      l.backward();
      opt->step();
      loss = l.template item<double>();
    }
    return loss;
  };
  if (mode == "ddp") {
    auto ddp = cpprun::DistributedDataParallel(net.ptr(), group);
    return step_all(ddp);
  }
  auto fsdp = cpprun::FullyShardedDataParallel(net.ptr(), group, cpprun::FsdpOptions().stage(3).wrap_policy(is_linear));
  return step_all(fsdp);
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--mode") c.mode = v;
    else if (k == "--budget-mb") c.budget_mb = std::stoll(v);
    else if (k == "--init") c.init = v;
    else if (k == "--optimizer") c.optimizer = v;
    else if (k == "--layers") c.layers = std::stoll(v);
    else if (k == "--width") c.width = std::stoll(v);
    else {
      throw std::invalid_argument("unknown flag " + k + " (--mode zero3|ddp, --budget-mb N, --init eager|deferred, "
                                  "--optimizer adamw|sgd, --layers N, --width N)");
    }
  }
  const std::string& mode = c.mode;
  const int64_t budget_mb = c.budget_mb;
  // Address space must track live memory: one malloc arena (each extra arena reserves 64 MB),
  // and large blocks returned to the system when freed (no growing mmap threshold).
  mallopt(M_ARENA_MAX, 1);
  mallopt(M_MMAP_THRESHOLD, 128 * 1024);
  torch::set_num_threads(1);
  auto group = cpprun::init_process_group();
  const int rank = group.rank();
  // Start every lazily created thread and pool now, before the budget: both modes, tiny model.
  for (const char* warm_mode : {"ddp", "zero3"}) {
    Config warm = c;
    warm.mode = warm_mode;
    if (warm.mode == "ddp") warm.init = "eager";  // DDP takes built modules (materialize() a deferred one)
    train(warm, build(warm, 16, 2), group, 1);
  }

  const int64_t base_kb = status_kb("VmSize");
  const rlim_t limit = static_cast<rlim_t>((base_kb + budget_mb * 1024) * 1024);
  struct rlimit cap {limit, limit};
  if (setrlimit(RLIMIT_AS, &cap) != 0) {
    std::perror("setrlimit");
    return 2;
  }
  try {
    const int64_t param_mb = c.layers * (c.width * c.width + c.width) * 4 / (1024 * 1024);
    if (rank == 0) std::printf("model: fp32 parameters %lld MB (budget %lld MB)\n", static_cast<long long>(param_mb),
                               static_cast<long long>(budget_mb));
    const double loss = train(c, build(c, c.width, c.layers), group, 3);
    const int64_t peak_kb = status_kb("VmPeak");
    if (rank == 0) {
      std::printf("fits: %s (%s init, %s) trained 3 steps (loss %.4g) within the %lld MB budget; peak address space "
                  "%lld MB over the start\n", mode.c_str(), c.init.c_str(), c.optimizer.c_str(), loss,
                  static_cast<long long>(budget_mb), static_cast<long long>((peak_kb - base_kb) / 1024));
    }
    return 0;
  } catch (const std::exception& e) {
    std::string what = e.what();
    const bool oom = what.find("can't allocate memory") != std::string::npos || what.find("bad_alloc") != std::string::npos;
    std::printf("%s: rank %d, %s (%s init): %s\n", oom ? "out of memory" : "error", rank, mode.c_str(), c.init.c_str(),
                what.substr(0, what.find('\n')).c_str());
    std::fflush(stdout);
    return oom ? 3 : 1;
  }
}
