// A sequence the tensor-parallel size does not divide, for tests/dist/tp_uneven_sequence.sh: an
// MLP with its LayerNorm on sequence shards (SequenceParallel, ColwiseParallel with input_layouts
// Shard(1), RowwiseParallel with output_layouts Shard(1)), fed x.chunk(tp, 1)[rank] of a sequence
// of 2 * tp + 1 tokens (shards of 3 and 2 at tp 2). The forward must throw on every rank, naming
// the cause and the fix. Each rank prints "rank R caught: MESSAGE", marks SYNC_DIR/failed.RANK,
// waits for the others' marks (so every rank's message is printed before cpprun stops the job)
// and returns 3: a normal exit, not a signal. A rank whose forward succeeds prints it and returns 0.
//
// usage: tp_uneven_sequence SYNC_DIR   (under cpprun --nproc_per_node=2)
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "cpprun/cpprun.h"

namespace fs = std::filesystem;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: tp_uneven_sequence SYNC_DIR\n");
    return 2;
  }
  const fs::path sync_dir = argv[1];
  auto pg = cpprun::init_process_group();
  const int tp = pg.size(), rank = pg.rank();
  torch::manual_seed(7);
  torch::nn::Sequential mlp(torch::nn::LayerNorm(torch::nn::LayerNormOptions({8})), torch::nn::Linear(8, 8 * tp),
                            torch::nn::GELU(), torch::nn::Linear(8 * tp, 8));
  cpprun::parallelize_module(mlp.ptr(), pg, {{"0", cpprun::SequenceParallel()},
                                             {"1", cpprun::ColwiseParallel().input_layouts(cpprun::Shard(1))},
                                             {"3", cpprun::RowwiseParallel().output_layouts(cpprun::Shard(1))}});
  const at::Tensor x = torch::randn({2, 2 * tp + 1, 8});
  try {
    const at::Tensor out = mlp->forward(x.chunk(tp, 1)[rank].contiguous());
    std::printf("rank %d: the forward gave shape [%lld, %lld, %lld]\n", rank, static_cast<long long>(out.size(0)),
                static_cast<long long>(out.size(1)), static_cast<long long>(out.size(2)));
    return 0;
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "rank %d caught: %s\n", rank, e.what_without_backtrace());
    std::fflush(stderr);
  }
  std::ofstream(sync_dir / ("failed." + std::to_string(rank))) << "1\n";
  for (int r = 0; r < tp; ++r) {
    const fs::path mark = sync_dir / ("failed." + std::to_string(r));
    for (int i = 0; i < 100 && !fs::exists(mark); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return 3;
}
