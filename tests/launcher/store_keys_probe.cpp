// One rank of tests/launcher/behaviour/store_keeper_restarts.sh, run under cpprun --max_restarts=1:
// attempt 0 writes keys into the workers' store, both outside PyTorch's per-attempt prefix and under
// /worker/attempt_0, trains, and its last rank fails (exit 3); attempt 1 must see none of them (a
// new store keeper serves a new store: Note [Store keeper]) and trains. Prints "attempt N: ..." lines.
#include <cpprun/cpprun.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

int main() {
  return cpprun::record([] {
    auto group = cpprun::init_process_group();
    const cpprun::DistEnv env = cpprun::read_dist_env();
    const int rank = group.rank(), world = group.size();
    // A client of the store itself, below the library's PrefixStore, as any process of the job may be.
    c10d::TCPStoreOptions options;
    options.port = static_cast<std::uint16_t>(env.master_port);
    options.waitWorkers = false;
    options.timeout = std::chrono::seconds(30);
    const auto raw = c10::make_intrusive<c10d::TCPStore>(env.master_addr, options);
    const auto key = [](const std::string& kind, int r) { return kind + std::to_string(r); };
    if (env.restart_count == 0) {
      raw->set(key("probe/unprefixed/", rank), std::vector<uint8_t>{'0'});
      raw->set(key("/worker/attempt_0/probe/", rank), std::vector<uint8_t>{'0'});
    } else {
      for (int r = 0; r < world; ++r) {
        for (const std::string& seen : {key("probe/unprefixed/", r), key("/worker/attempt_0/probe/", r)}) {
          if (raw->check({seen})) {
            std::printf("attempt %d: sees attempt 0's key %s\n", env.restart_count, seen.c_str());
            return 2;
          }
        }
      }
      std::printf("attempt %d: none of attempt 0's keys\n", env.restart_count);
    }
    cpprun::barrier(group);  // every rank's keys are in before any rank fails

    // A few steps of DDP on a least-squares fit: the loss falls on every attempt.
    torch::manual_seed(0);
    auto net = torch::nn::Linear(4, 1);
    auto model = cpprun::DistributedDataParallel(net, group);
    torch::optim::SGD optimizer(model->parameters(), 0.1);
    const auto generator = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(rank + 1));
    const auto x = torch::randn({64, 4}, generator);
    const auto y = x.sum(1, true);
    double first = 0, last = 0;
    for (int step = 0; step < 20; ++step) {
      optimizer.zero_grad();
      auto loss = torch::mse_loss(model->forward(x), y);
      loss.backward();
      optimizer.step();
      (step == 0 ? first : last) = loss.item<double>();
    }
    std::printf("attempt %d trained: loss %.4f -> %.4f%s\n", env.restart_count, first, last,
                last < first ? " (falling)" : " (not falling)");
    std::fflush(stdout);
    cpprun::barrier(group);
    return env.restart_count == 0 && rank == world - 1 ? 3 : 0;
  });
}
