// One side of scripts/bench_pipeline.sh: pipeline-parallel training steps of a stack of residual
// MLP blocks, timed, with the bubble each rank measured and the activation memory it held.
// bench/pipeline_bench.py is the PyTorch side (torch.distributed.pipelining), same flags, same
// lines.
//
//   cpprun --standalone --nproc_per_node=2 build/bench/pipeline_bench --schedule 1f1b --microbatches 4
//          [--layers 8] [--dim 128] [--batch 2048] [--steps 10] [--warmup 3] [--stages-per-rank 2]
//   build/bench/pipeline_bench --schedule none   (the whole model in one process, no pipeline)
//
// The model: Linear(64, d) "in", blocks "block0".. (x + Linear(4d, d)(GELU(Linear(d, 4d)(LayerNorm(x))))),
// Linear(d, 16) "head"; float32, MSE against fixed random targets. Every stage gets layers/stages
// blocks, "in" going with the first and "head" with the last (split_evenly counts children, and
// these two are a fraction of a block each). --schedule interleaved and looped (LoopedBFS) run
// --stages-per-rank stages on each rank (default 2). One process per schedule and micro-batch count, so that its peak
// resident memory is that configuration's.
//
// Prints one RESULT line per rank: the median over --steps of the step's wall time, of
// waiting_seconds / seconds from last_step_stats() (the bubble as this rank saw it), and of the
// fractions of the step the main thread (it runs every kernel: one thread a rank) slept
// ("blocked": the figure the PyTorch side gives too) and waited for a core that another process
// held ("runq"; /proc/self/schedstat), beside the formulas (p-1)/(m+p-1) (interleaved and looped
// (p-1)/(v m+p-1)) and the issue's (p-1)/m ((p-1)/(v m)); peak_held; rows per second; act_mb: how
// far the peak resident memory (VmHWM, ru_maxrss) rose above the resident size once the model,
// stage and batch were built and a few rows had gone through (the kernels' and the BLAS's one-time
// buffers are no activations).
#include <cpprun/cpprun.h>
#include <torch/torch.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "median.h"
#include "peak_rss.h"

namespace {

constexpr int64_t kInputs = 64, kOutputs = 16;

struct Args {
  std::string schedule = "1f1b";  // gpipe | 1f1b | interleaved | looped | zb | none
  int microbatches = 4, layers = 8, stages_per_rank = 2, steps = 10, warmup = 3;
  int64_t dim = 128, batch = 2048;
};

struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(int64_t d)
      : norm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})))),
        up(register_module("up", torch::nn::Linear(d, 4 * d))),
        down(register_module("down", torch::nn::Linear(4 * d, d))) {}
  at::Tensor forward(const at::Tensor& x) { return x + down(torch::gelu(up(norm(x)))); }
  torch::nn::LayerNorm norm;
  torch::nn::Linear up, down;
};
TORCH_MODULE(Block);

torch::nn::Sequential make_model(const Args& a) {
  torch::manual_seed(0);
  torch::nn::Sequential net;
  net->push_back("in", torch::nn::Linear(kInputs, a.dim));
  for (int i = 0; i < a.layers; ++i) net->push_back("block" + std::to_string(i), Block(a.dim));
  net->push_back("head", torch::nn::Linear(a.dim, kOutputs));
  return net;
}

// layers / stages blocks a stage, "in" with the first and "head" with the last.
cpprun::PipelineSplit block_split(const Args& a, int stages) {
  cpprun::PipelineSplit split(stages);
  const int per_stage = a.layers / stages;
  for (int s = 0; s < stages; ++s) {
    if (s == 0) split[s].push_back("in");
    for (int b = s * per_stage; b < (s + 1) * per_stage; ++b) split[s].push_back("block" + std::to_string(b));
    if (s == stages - 1) split[s].push_back("head");
  }
  return split;
}

double resident_bytes() {  // this process's resident memory now
  long total = 0, resident = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld %ld", &total, &resident) != 2) resident = 0;
    std::fclose(f);
  }
  return static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE));
}

// The main thread's time on a core and time ready but waiting for one, so far, in seconds
// (/proc/self/schedstat: the thread-group leader's). The rest of a step it slept: blocked.
struct SchedTimes {
  double on_cpu = 0, runnable = 0;
};
SchedTimes sched_times() {
  unsigned long long on_cpu = 0, runnable = 0;
  if (FILE* f = std::fopen("/proc/self/schedstat", "r")) {
    if (std::fscanf(f, "%llu %llu", &on_cpu, &runnable) != 2) on_cpu = runnable = 0;
    std::fclose(f);
  }
  return {static_cast<double>(on_cpu) * 1e-9, static_cast<double>(runnable) * 1e-9};
}

[[noreturn]] void usage_error(const std::string& what) {
  std::fprintf(stderr,
               "pipeline_bench: %s (--schedule gpipe|1f1b|interleaved|looped|zb|none --microbatches M --layers L --dim D "
               "--batch B --steps N --warmup N --stages-per-rank V)\n",
               what.c_str());
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) usage_error(flag + " needs a value");
    const std::string value = argv[++i];
    if (flag == "--schedule") a.schedule = value;
    else if (flag == "--microbatches") a.microbatches = std::stoi(value);
    else if (flag == "--layers") a.layers = std::stoi(value);
    else if (flag == "--dim") a.dim = std::stoll(value);
    else if (flag == "--batch") a.batch = std::stoll(value);
    else if (flag == "--steps") a.steps = std::stoi(value);
    else if (flag == "--warmup") a.warmup = std::stoi(value);
    else if (flag == "--stages-per-rank") a.stages_per_rank = std::stoi(value);
    else usage_error("unknown option '" + flag + "'");
  }
  if (a.schedule != "gpipe" && a.schedule != "1f1b" && a.schedule != "interleaved" && a.schedule != "looped" &&
      a.schedule != "zb" && a.schedule != "none") {
    usage_error("--schedule " + a.schedule + " is none of gpipe, 1f1b, interleaved, looped, zb, none");
  }
  if (a.steps < 1 || a.warmup < 0 || a.microbatches < 1 || a.layers < 1 || a.stages_per_rank < 1) {
    usage_error("--steps, --microbatches, --layers and --stages-per-rank must be 1 or more, --warmup 0 or more");
  }
  return a;
}

at::Tensor mse(const at::Tensor& output, const at::Tensor& target) { return torch::mse_loss(output, target); }

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  const bool pipelined = a.schedule != "none";
  std::unique_ptr<cpprun::ProcessGroup> group;
  if (pipelined) group = std::make_unique<cpprun::ProcessGroup>(cpprun::init_process_group());
  const int p = pipelined ? group->size() : 1, rank = pipelined ? group->rank() : 0;
  const int v = a.schedule == "interleaved" || a.schedule == "looped" ? a.stages_per_rank : 1;
  if (a.layers % (p * v) != 0) {
    usage_error("--layers " + std::to_string(a.layers) + " does not divide into " + std::to_string(p * v) +
                " stages of equal blocks (" + std::to_string(p) + " ranks x " + std::to_string(v) + " per rank)");
  }
  torch::nn::Sequential model = make_model(a);
  torch::manual_seed(1);
  const at::Tensor x = torch::randn({a.batch, kInputs}), y = torch::randn({a.batch, kOutputs});

  std::vector<cpprun::PipelineStage> stages;
  std::vector<cpprun::PipelineStage*> mine;
  std::unique_ptr<cpprun::PipelineSchedule> schedule;
  std::vector<at::Tensor> params = model->parameters();
  std::string stage_list = "all";
  if (pipelined) {
    const auto split = block_split(a, p * v);
    stages.reserve(v);
    params.clear();
    stage_list.clear();
    for (int k = 0; k < v; ++k) {
      stages.emplace_back(model, split, *group, rank + k * p);
      for (const auto& t : stages.back().parameters()) params.push_back(t);
      stage_list += (k ? "," : "") + std::to_string(rank + k * p);
    }
    for (auto& s : stages) mine.push_back(&s);
    if (a.schedule == "gpipe") schedule = std::make_unique<cpprun::ScheduleGPipe>(stages[0], a.microbatches, mse);
    else if (a.schedule == "1f1b") schedule = std::make_unique<cpprun::Schedule1F1B>(stages[0], a.microbatches, mse);
    else if (a.schedule == "zb") schedule = std::make_unique<cpprun::ScheduleZeroBubble>(stages[0], a.microbatches, mse);
    else if (a.schedule == "looped") schedule = std::make_unique<cpprun::ScheduleLoopedBFS>(mine, a.microbatches, mse);
    else schedule = std::make_unique<cpprun::ScheduleInterleaved1F1B>(mine, a.microbatches, mse);
  }
  // A few rows through each of this rank's modules first: the kernels' and the BLAS's one-time
  // buffers (about 13 MB here, the same on the PyTorch side) are no activation memory.
  auto touch = [&](torch::nn::Sequential module, int64_t width) {
    module->forward(torch::randn({8, width})).sum().backward();
  };
  if (pipelined) {
    for (auto& s : stages) touch(s.module(), s.is_first() ? kInputs : a.dim);
    cpprun::barrier(*group);
  } else {
    touch(model, kInputs);
  }
  const double rss_built = resident_bytes();

  std::vector<double> wall, waiting, blocked, runq;
  int peak_held = 0;
  for (int step = 0; step < a.warmup + a.steps; ++step) {
    for (auto& t : params) t.mutable_grad().reset();
    if (pipelined) cpprun::barrier(*group);  // every rank starts the step together
    const SchedTimes before = sched_times();
    const auto t0 = std::chrono::steady_clock::now();
    if (pipelined) {
      schedule->step(x, y);
    } else {
      mse(model->forward(x), y).backward();
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const SchedTimes after = sched_times();
    if (step < a.warmup) continue;
    wall.push_back(seconds);
    const double on_cpu = after.on_cpu - before.on_cpu, runnable = after.runnable - before.runnable;
    blocked.push_back(std::max(0.0, 1.0 - (on_cpu + runnable) / seconds));
    runq.push_back(std::min(1.0, runnable / seconds));
    if (pipelined) {
      const auto& stats = schedule->last_step_stats();
      waiting.push_back(stats.bubble_fraction());
      peak_held = std::max(peak_held, stats.peak_held);
    }
  }
  const double act_mb = (static_cast<double>(bench::peak_rss()) - rss_built) / (1 << 20);
  const double m = a.microbatches;
  // Zero bubble's: ZB-H1's ideal with F = I = W (a third of 1F1B's idle slots).
  const double formula = a.schedule == "zb" ? (p - 1) / (3 * m + p - 1) : (p - 1) / (v * m + p - 1),
               issue_formula = a.schedule == "zb" ? (p - 1) / (3 * m) : (p - 1) / (v * m);
  const double ms = bench::median(wall) * 1e3;
  char bubble[32] = "-";
  if (pipelined) std::snprintf(bubble, sizeof bubble, "%.4f", bench::median(waiting));
  std::printf(
      "RESULT impl=cpprun schedule=%s p=%d v=%d m=%d rank=%d stages=%s layers=%d dim=%lld batch=%lld threads=%d "
      "ms_per_step=%.3f bubble=%s blocked=%.4f runq=%.4f formula=%.4f issue_formula=%.4f peak_held=%d rows_per_s=%.1f "
      "act_mb=%.1f\n",
      a.schedule.c_str(), p, v, pipelined ? a.microbatches : 1, rank, stage_list.c_str(), a.layers,
      static_cast<long long>(a.dim), static_cast<long long>(a.batch), at::get_num_threads(), ms, bubble,
      bench::median(blocked), bench::median(runq), formula, issue_formula, peak_held,
      static_cast<double>(a.batch) / (ms / 1e3), act_mb);
  std::fflush(stdout);
  if (pipelined) cpprun::barrier(*group);  // no rank tears down while another still prints
  return 0;
}
