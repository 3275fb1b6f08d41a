// Per-rank bytes held in parameters, gradients and optimizer state (fp32 AdamW), steady state
// (after a step) and peak, for cpprun's DDP and ZeRO-1/2/3, next to the ZeRO paper's formulas.
// Run by scripts/bench_memory.sh. MLP 1024-[H x 4]-10, one unit per Linear.
//
//   cpprun --nproc_per_node=4 build/bench/fsdp_memory --mode zero3 --hidden 1024
//   modes: ddp (with gradient_as_bucket_view: gradients live in the buckets), zero1, zero2,
//          zero3, and zero2-min, zero3-min (gathered_unit_limit 1, no prefetch: least memory)
//   --frozen 1: every weight but the last layer's frozen (requires_grad false), as a LoRA-style
//          fine-tune's base: FSDP shards them too, and nothing reduces them (psi counts them)
#include <cpprun/cpprun.h>
#include <torch/torch.h>

#include <cstdio>
#include <fstream>
#include <set>
#include <string>

#include "bench_mlp.h"
#include "peak_rss.h"

namespace {


int64_t distinct_storage_bytes(const std::vector<torch::Tensor>& tensors) {
  std::set<const void*> seen;
  int64_t bytes = 0;
  for (const auto& t : tensors) {
    if (t.defined() && seen.insert(t.storage().unsafeGetStorageImpl()).second) bytes += t.storage().nbytes();
  }
  return bytes;
}

int64_t optimizer_bytes(torch::optim::Optimizer& opt) {
  int64_t bytes = 0;
  for (const auto& item : opt.state()) {
    if (auto* s = dynamic_cast<torch::optim::AdamWParamState*>(item.second.get())) {
      bytes += s->exp_avg().nbytes() + s->exp_avg_sq().nbytes();
    }
  }
  return bytes;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = "ddp";
  int64_t hidden = 1024;
  bool frozen = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--mode") mode = v;
    else if (k == "--hidden") hidden = std::stoll(v);
    else if (k == "--frozen") frozen = v == "1";
    else throw std::invalid_argument("unknown flag " + k + " (--mode, --hidden, --frozen)");
  }
  torch::set_num_threads(1);
  auto group = cpprun::init_process_group();
  const int64_t rss_before = bench::peak_rss();
  torch::manual_seed(0);
  auto net = bench::make_mlp(hidden);
  if (frozen) bench::freeze_all_weights_but_the_head(net);
  int64_t psi = 0;
  for (const auto& p : net->parameters()) psi += p.numel();
  auto x = torch::randn({16, 1024});
  auto y = torch::randint(0, 10, {16}, torch::kLong);

  int64_t params = 0, grads = 0, optim = 0, peak_params = 0, peak_grads = 0, kept = 0;
  auto train = [&](auto& model, torch::optim::Optimizer& opt) {
    for (int step = 0; step < 3; ++step) {
      opt.zero_grad();
      torch::nn::functional::cross_entropy(model->forward(x), y).backward();
      opt.step();
    }
    optim = optimizer_bytes(opt);
  };
  if (mode == "ddp") {
    auto ddp = cpprun::DistributedDataParallel(net.ptr(), group, cpprun::DdpOptions().gradient_as_bucket_view(true));
    torch::optim::AdamW opt(ddp->parameters(), 1e-3);
    train(ddp, opt);
    std::vector<torch::Tensor> ps = net->parameters(), gs;
    for (const auto& p : ps) gs.push_back(p.grad());
    params = peak_params = distinct_storage_bytes(ps);
    grads = peak_grads = distinct_storage_bytes(gs);
  } else {
    const int stage = mode[4] - '0';
    auto per_linear = [](const torch::nn::Module& m) { return dynamic_cast<const torch::nn::LinearImpl*>(&m) != nullptr; };
    auto options = cpprun::FsdpOptions().stage(stage).wrap_policy(per_linear);
    if (mode.size() > 5 && mode.substr(5) == "-min") options.gathered_unit_limit(1).prefetch(false);
    auto fsdp = cpprun::FullyShardedDataParallel(net.ptr(), group, options);
    torch::optim::AdamW opt(fsdp->parameters(), 1e-3);
    train(fsdp, opt);
    const auto m = fsdp->memory();
    params = m.parameters + m.shards;
    peak_params = m.peak_parameters + m.shards;
    grads = m.gradients;
    peak_grads = m.peak_gradients;
    kept = m.kept;
  }
  if (group.rank() == 0) {
    std::printf("RESULT mode=%s frozen=%d world=%d psi=%lld params=%lld grads=%lld optim=%lld peak_params=%lld "
                "peak_grads=%lld kept=%lld rss_growth=%lld\n",
                mode.c_str(), frozen ? 1 : 0, group.size(), static_cast<long long>(psi), static_cast<long long>(params),
                static_cast<long long>(grads), static_cast<long long>(optim), static_cast<long long>(peak_params),
                static_cast<long long>(peak_grads), static_cast<long long>(kept),
                static_cast<long long>(bench::peak_rss() - rss_before));
  }
}
