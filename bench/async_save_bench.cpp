// scripts/bench_async_save.sh's program: what a save costs training, synchronous against
// asynchronous (cpprun::save_async), for dp_bench's MLP 1024-[H x 4]-10 (H = 2720: 25M
// parameters, 100 MB) under DDP. It times training steps with no save in flight; each save's
// blocking time (how long the call keeps the training thread); and, for save_async, the steps
// run while the background write is in flight. Prints one RESULT line (rank 0's), medians over
// --saves saves of each kind. With --optimizer P, each save also writes the optimizer's state
// (SGD's momentum: as many bytes again) to P: save_state_dict + save_optimizer_state_dict against
// one save_async(model, optimizer, ...).
//
//   cpprun --nproc_per_node=2 build/bench/async_save_bench --hidden 2720 --path /tmp/bench_ckpt.safetensors
//          [--optimizer /tmp/bench_opt.safetensors] [--saves 3] [--steps 10]
//          (a path ending in '/': Hugging Face's sharded directory, a file per rank)
#include <cpprun/cpprun.h>
#include <torch/torch.h>

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "bench_mlp.h"
#include "median.h"

namespace {

using bench::median;
using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

double thread_cpu_ms() {  // the calling thread's user + system time so far
  rusage usage{};
  getrusage(RUSAGE_THREAD, &usage);
  auto ms = [](const timeval& t) { return t.tv_sec * 1e3 + t.tv_usec / 1e3; };
  return ms(usage.ru_utime) + ms(usage.ru_stime);
}

struct Args {
  int64_t hidden = 2720, batch = 64;
  int steps = 10, saves = 3;
  std::string path = "/tmp/cpprun_async_save_bench.safetensors";
  std::string optimizer;  // where the optimizer's state goes; empty: the model alone
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (i + 1 >= argc) throw std::invalid_argument(k + " needs a value");
    const std::string v = argv[++i];
    if (k == "--hidden") a.hidden = std::stoll(v);
    else if (k == "--batch") a.batch = std::stoll(v);
    else if (k == "--steps") a.steps = std::stoi(v);
    else if (k == "--saves") a.saves = std::stoi(v);
    else if (k == "--path") a.path = v;
    else if (k == "--optimizer") a.optimizer = v;
    else throw std::invalid_argument("unknown flag " + k + " (--hidden, --batch, --steps, --saves, --path, --optimizer)");
  }
  return a;
}

int run(int argc, char** argv) {
  const Args args = parse(argc, argv);
  torch::set_num_threads(1);
  auto group = cpprun::init_process_group();
  torch::manual_seed(0);
  auto net = bench::make_mlp(args.hidden);
  int64_t params = 0;
  for (const auto& p : net->parameters()) params += p.numel();
  auto model = cpprun::DistributedDataParallel(net.ptr(), group);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  const auto x = torch::randn({args.batch, 1024});
  const auto y = torch::randint(0, 10, {args.batch}, torch::kLong);
  auto step = [&] {
    const auto start = Clock::now();
    opt.zero_grad();
    torch::nn::functional::cross_entropy(model->forward(x), y).backward();
    opt.step();
    return ms_since(start);
  };

  for (int i = 0; i < 3; ++i) step();  // warm-up
  std::vector<double> plain_steps;
  for (int i = 0; i < args.steps; ++i) plain_steps.push_back(step());

  // Synchronous: the call blocks until the file is on disk on every rank.
  std::vector<double> sync_block, sync_cpu;
  for (int i = 0; i < args.saves; ++i) {
    cpprun::barrier(group);
    const double cpu = thread_cpu_ms();
    const auto start = Clock::now();
    cpprun::save_state_dict(model, args.path);
    if (!args.optimizer.empty()) cpprun::save_optimizer_state_dict(model, opt, args.optimizer);
    sync_block.push_back(ms_since(start));
    sync_cpu.push_back(thread_cpu_ms() - cpu);
    step();
  }
  // Asynchronous: the call blocks while the state is copied; steps go on during the write. Each
  // rank trains until its save is done (a rank-0 file: when rank 0's thread has written it), and
  // the ranks agree on the count, as DDP needs every rank to run the same steps.
  std::vector<double> async_block, during_steps, spanned;
  for (int i = 0; i < args.saves; ++i) {
    cpprun::barrier(group);
    const auto start = Clock::now();
    cpprun::AsyncSave pending = args.optimizer.empty() ? cpprun::save_async(model, args.path)
                                                       : cpprun::save_async(model, opt, args.path, args.optimizer);
    async_block.push_back(ms_since(start));
    int steps = 0;
    for (;;) {
      auto done = torch::tensor({pending.done() ? 1 : 0}, torch::kInt);
      cpprun::all_reduce(group, done, cpprun::ReduceOp::kMin);
      if (done.item<int>() == 1 || steps >= 100) break;
      during_steps.push_back(step());
      ++steps;
    }
    spanned.push_back(steps);
    pending.wait();
  }
  if (group.rank() == 0) {
    std::printf("RESULT params=%lld world=%d path=%s optimizer=%s step_ms=%.1f sync_block_ms=%.1f sync_cpu_ms=%.1f "
                "async_block_ms=%.1f during_step_ms=%.1f steps_during_save=%.0f\n",
                static_cast<long long>(params), group.size(), args.path.c_str(),
                args.optimizer.empty() ? "-" : args.optimizer.c_str(), median(plain_steps),
                median(sync_block), median(sync_cpu), median(async_block), median(during_steps), median(spanned));
  }
  cpprun::barrier(group);
  if (group.rank() == 0) std::filesystem::remove_all(args.path);
  if (group.rank() == 0 && !args.optimizer.empty()) std::filesystem::remove_all(args.optimizer);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "async_save_bench: %s\n", e.what());
    return 2;
  }
}
