// One side of scripts/bench_ddp.sh and scripts/bench_fsdp.sh: times training steps of an MLP
// 1024-[H x 4]-10 with cpprun's DistributedDataParallel ("ddp"), FullyShardedDataParallel at
// ZeRO stage 1, 2 or 3 ("zero1", "zero2", "zero3"; one unit per Linear), or the same per-rank work with no
// communication ("local"). bench/dp_bench.py is the PyTorch side. Prints one RESULT line.
//
//   cpprun --nproc_per_node=2 build/bench/dp_bench --mode ddp --hidden 1024 --batch 64
#include <cpprun/cpprun.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <string>

struct Args {
  std::string mode = "ddp";
  int64_t hidden = 1024, batch = 64;  // batch per rank
  int warmup = 5, steps = 20;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--mode") a.mode = v;
    else if (k == "--hidden") a.hidden = std::stoll(v);
    else if (k == "--batch") a.batch = std::stoll(v);
    else if (k == "--warmup") a.warmup = std::stoi(v);
    else if (k == "--steps") a.steps = std::stoi(v);
    else throw std::invalid_argument("unknown flag " + k);
  }
  return a;
}

torch::nn::Sequential make_mlp(int64_t hidden) {
  torch::nn::Sequential net(torch::nn::Linear(1024, hidden), torch::nn::ReLU());
  for (int i = 0; i < 3; ++i) net->push_back(torch::nn::Linear(hidden, hidden)), net->push_back(torch::nn::ReLU());
  net->push_back(torch::nn::Linear(hidden, 10));
  return net;
}

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  torch::set_num_threads(1);
  auto group = cpprun::init_process_group();
  torch::manual_seed(0);
  auto net = make_mlp(args.hidden);
  auto x = torch::randn({args.batch, 1024});
  auto y = torch::randint(0, 10, {args.batch}, torch::kLong);

  auto run = [&](auto& model) {
    torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
    auto step = [&] {
      opt.zero_grad();
      torch::nn::functional::cross_entropy(model->forward(x), y).backward();
      opt.step();
    };
    for (int i = 0; i < args.warmup; ++i) step();
    cpprun::barrier(group);
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < args.steps; ++i) step();
    cpprun::barrier(group);
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() / args.steps;
  };

  int64_t params = 0;
  for (const auto& p : net->parameters()) params += p.numel();
  double ms;
  if (args.mode == "ddp") {
    auto ddp = cpprun::DistributedDataParallel(net.ptr(), group);
    ms = run(ddp);
  } else if (args.mode == "zero1" || args.mode == "zero2" || args.mode == "zero3") {
    auto per_linear = [](const torch::nn::Module& m) { return dynamic_cast<const torch::nn::LinearImpl*>(&m) != nullptr; };
    auto options = cpprun::FsdpOptions().stage(args.mode.back() - '0').wrap_policy(per_linear);
    auto fsdp = cpprun::FullyShardedDataParallel(net.ptr(), group, options);
    ms = run(fsdp);
  } else if (args.mode == "local") {
    ms = run(net);
  } else {
    throw std::invalid_argument("--mode must be ddp, zero1, zero2, zero3 or local");
  }
  if (group.rank() == 0) {
    std::printf("RESULT impl=cpprun mode=%s params=%lld world=%d ms_per_step=%.2f samples_per_s=%.1f\n",
                args.mode.c_str(), static_cast<long long>(params), group.size(), ms,
                1000.0 * args.batch * group.size() / ms);
  }
}
