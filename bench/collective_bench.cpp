// Times cpprun's collectives on the current backend: all_reduce, reduce_scatter, all_gather_into,
// and all-reduce done as reduce_scatter + all_gather_into, for a few sizes. Rank 0 prints one
// line per size with the median ms of each.
//
//   cpprun --nproc_per_node=2 build/bench/collective_bench [--reps 9]
#include <cpprun/cpprun.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  int reps = 9;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::string(argv[i]) == "--reps") reps = std::stoi(argv[i + 1]);
  }
  torch::set_num_threads(1);
  auto group = cpprun::init_process_group();
  const int n = group.size();
  auto median_ms = [&](const std::function<void()>& op) {
    std::vector<double> ms;
    op();  // warm-up
    for (int r = 0; r < reps; ++r) {
      cpprun::barrier(group);
      const auto start = std::chrono::steady_clock::now();
      op();
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  };
  if (group.rank() == 0) std::printf("%10s %14s %16s %16s %22s\n", "MB", "all_reduce", "reduce_scatter", "all_gather_into", "reduce_scatter+gather");
  for (int64_t mb : {4, 16, 100}) {
    const int64_t numel = mb * (1 << 20) / 4 / n * n;
    auto full = torch::randn({numel});
    auto shard = torch::empty({numel / n});
    const double ar = median_ms([&] { cpprun::all_reduce(group, full); });
    const double rs = median_ms([&] { cpprun::reduce_scatter(group, shard, full); });
    const double ag = median_ms([&] { cpprun::all_gather_into(group, full, shard); });
    const double both = median_ms([&] {
      cpprun::reduce_scatter(group, shard, full);
      cpprun::all_gather_into(group, full, shard);
    });
    if (group.rank() == 0) std::printf("%10lld %14.2f %16.2f %16.2f %22.2f\n", static_cast<long long>(mb), ar, rs, ag, both);
  }
}
