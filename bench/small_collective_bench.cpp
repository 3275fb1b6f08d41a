// Times cpprun's collectives at small sizes, where a fixed per-call cost (such as the checks
// that compare ranks' calls before a broadcast or a ring collective) would show: broadcast,
// all_gather_into, reduce_scatter and all_reduce of 1 KiB, 64 KiB and 1 MiB. Rank 0 prints the
// median microseconds per call of each. Uses only the public API, so the same source can be
// linked against another build of the library to compare.
//
//   cpprun --nproc_per_node=2 build/bench/small_collective_bench [--reps 300]
#include <cpprun/cpprun.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  int reps = 300;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::string(argv[i]) == "--reps") reps = std::stoi(argv[i + 1]);
  }
  torch::set_num_threads(1);
  auto group = cpprun::init_process_group();
  const int n = group.size();
  // Median over `reps` calls, each timed alone between barriers.
  auto median_us = [&](const std::function<void()>& op) {
    std::vector<double> us;
    for (int r = 0; r < 10; ++r) op();  // warm-up
    for (int r = 0; r < reps; ++r) {
      cpprun::barrier(group);
      const auto start = std::chrono::steady_clock::now();
      op();
      us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
    }
    std::sort(us.begin(), us.end());
    return us[us.size() / 2];
  };
  if (group.rank() == 0) {
    std::printf("%8s %12s %16s %16s %12s   (median us per call, %d ranks, %d calls)\n", "KiB",
                "broadcast", "all_gather_into", "reduce_scatter", "all_reduce", n, reps);
  }
  for (int64_t kib : {1, 64, 1024}) {
    const int64_t numel = kib * 1024 / 4 / n * n;
    auto full = torch::randn({numel});
    auto shard = torch::empty({numel / n});
    const double bc = median_us([&] { cpprun::broadcast(group, full, 0); });
    const double ag = median_us([&] { cpprun::all_gather_into(group, full, shard); });
    const double rs = median_us([&] { cpprun::reduce_scatter(group, shard, full); });
    const double ar = median_us([&] { cpprun::all_reduce(group, full); });
    if (group.rank() == 0) {
      std::printf("%8lld %12.1f %16.1f %16.1f %12.1f\n", static_cast<long long>(kib), bc, ag, rs, ar);
    }
  }
}
