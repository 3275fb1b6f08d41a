// One side of scripts/bench_ddp.sh and scripts/bench_fsdp.sh: times training steps of an MLP
// 1024-[H x 4]-10 with cpprun's DistributedDataParallel ("ddp"), FullyShardedDataParallel at
// ZeRO stage 1, 2 or 3 ("zero1", "zero2", "zero3"; one unit per Linear), the same per-rank work with no
// communication ("local"), or only the communication: one all-reduce of a flat tensor as large as
// all the gradients ("allreduce", DDP's floor). bench/dp_bench.py is the PyTorch side. Prints one
// RESULT line, with the process's CPU time per step (all threads, Gloo's included) beside the wall
// time: on a machine whose cores the ranks' compute already fills, communication's CPU time
// cannot be hidden by overlap. peak_rss_mb: how far the process's peak resident memory rose above
// its size just before the model was built (bench/dp_bench.py measures the same way). Before it,
// rank 0 prints each rank's compute and waiting per timed step (cpprun/step_timing.h). Each rank
// trains on its slice of one global batch. With --check (ddp and zero modes), the model is float64
// and every rank then compares its trained parameters with a one-process copy trained here on the
// whole global batch, printing the worst difference; a mismatch exits 1 (tests/gpu/cuda_steps.sh,
// and dist.dp_bench.check.* on the CPU). With --frozen 1, every Linear's weight but the head's is
// frozen before wrapping, a LoRA-style fine-tune's base (bench_mlp.h): FSDP shards and gathers
// those weights and reduces no gradient for them, DDP reduces only what trains
// (scripts/bench_frozen.sh: the step's time against FSDP2's and PyTorch DDP's).
//
//   cpprun --nproc_per_node=2 build/bench/dp_bench --mode ddp --hidden 1024 --batch 64 [--bucket-view] [--check]
//          [--frozen 1]
//          [--device cuda]   (each rank on GPU LOCAL_RANK, gradients over NCCL)
//          [--device cuda:N] (every rank on GPU N, gradients over Gloo: ranks sharing one GPU, which
//                             NCCL refuses; Gloo copies CUDA tensors through host memory)
#include <cpprun/cpprun.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>

#include "bench_mlp.h"

double cpu_ms() {  // this process's user + system time so far, every thread
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  auto ms = [](const timeval& t) { return t.tv_sec * 1e3 + t.tv_usec / 1e3; };
  return ms(usage.ru_utime) + ms(usage.ru_stime);
}

double resident_mb() {  // this process's resident memory now
  long pages_total = 0, pages_resident = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld %ld", &pages_total, &pages_resident) != 2) pages_resident = 0;
    std::fclose(f);
  }
  return static_cast<double>(pages_resident) * static_cast<double>(sysconf(_SC_PAGESIZE)) / (1 << 20);
}

double peak_resident_mb() {  // the most this process has been resident, ever
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024;  // ru_maxrss is in KiB on Linux
}

struct Timing {
  double wall_ms = 0, cpu_ms = 0;  // per step
};

struct Args {
  std::string mode = "ddp";
  int64_t hidden = 1024, batch = 64;  // batch per rank
  int warmup = 5, steps = 20;
  bool bucket_view = false;  // DDP with gradient_as_bucket_view
  bool check = false;  // float64, and the trained parameters compared with one process's
  bool frozen = false;  // every weight but the head's frozen (bench::freeze_all_weights_but_the_head)
  std::string device = "cpu";  // or "cuda": this rank's GPU (LOCAL_RANK), with NCCL
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--bucket-view") {
      a.bucket_view = true;
      continue;
    }
    if (k == "--check") {
      a.check = true;
      continue;
    }
    if (k == "--help") {
      throw std::invalid_argument("flags: --mode ddp|zero1|zero2|zero3|local|allreduce (ddp) --hidden N (1024) "
                                  "--batch N per rank (64) --warmup N (5) --steps N (20) --device cpu|cuda (cpu) "
                                  "--frozen 0|1 (0) --bucket-view --check; scripts/bench_ddp.sh and bench_fsdp.sh "
                                  "run it");
    }
    if (i + 1 == argc) throw std::invalid_argument("flag " + k + " needs a value (--help lists the flags)");
    const std::string v = argv[++i];
    if (k == "--mode") a.mode = v;
    else if (k == "--hidden") a.hidden = std::stoll(v);
    else if (k == "--batch") a.batch = std::stoll(v);
    else if (k == "--warmup") a.warmup = std::stoi(v);
    else if (k == "--steps") a.steps = std::stoi(v);
    else if (k == "--device") a.device = v;
    else if (k == "--frozen") {
      if (v != "0" && v != "1") throw std::invalid_argument("--frozen takes 0 or 1, not " + v);
      a.frozen = v == "1";
    } else throw std::invalid_argument("unknown flag " + k);
  }
  if (a.check && a.mode != "ddp" && a.mode.rfind("zero", 0) != 0) {
    throw std::invalid_argument("--check needs --mode ddp, zero1, zero2 or zero3 (not " + a.mode + ")");
  }
  return a;
}

template <typename Model>
void train_step(Model& model, torch::optim::Optimizer& opt, const torch::Tensor& x, const torch::Tensor& y) {
  opt.zero_grad();
  torch::nn::functional::cross_entropy(model->forward(x), y).backward();
  opt.step();
}

torch::optim::SGDOptions sgd_options() { return torch::optim::SGDOptions(0.01).momentum(0.9); }

// The tolerance of --check: in float64, 1 and N ranks differ by the summation order's rounding
// (measured on 2 CPU ranks: 2.2e-16 after 5 and after 7 steps, hidden 63 and 512, every mode);
// gradients summed instead of averaged give 0.35.
constexpr double kCheckTolerance = 1e-10;

// --check: this rank's trained parameters against `reference`, trained in one process on the whole
// global batch for as many steps; prints the worst difference (relative to the reference
// parameter's largest magnitude) and returns whether it is within kCheckTolerance.
bool matches_reference(const torch::nn::Module& trained, const torch::nn::Module& reference, int rank) {
  const auto expected = reference.named_parameters();
  double worst = 0;
  std::string worst_name;
  for (const auto& p : trained.named_parameters()) {
    const torch::Tensor& e = expected[p.key()];
    const double scale = std::max(e.abs().max().item<double>(), 1e-30);
    const double difference = (p.value() - e).abs().max().item<double>() / scale;
    if (!(difference <= worst)) worst = difference, worst_name = p.key();  // NaN counts as the worst
  }
  const bool ok = worst <= kCheckTolerance;
  std::printf("check rank %d: %s: worst relative difference %.3g (parameter %s) against one process on the "
              "global batch; tolerance %.0e\n", rank, ok ? "ok" : "MISMATCH", worst, worst_name.c_str(), kCheckTolerance);
  std::fflush(stdout);
  return ok;
}

int run(int argc, char** argv) {
  const Args args = parse(argc, argv);
  const bool shared_gpu = args.device.rfind("cuda:", 0) == 0;
  if (args.device != "cpu" && args.device != "cuda" && !shared_gpu) {
    throw std::invalid_argument("--device must be cpu, cuda or cuda:N");
  }
  const torch::Device device = shared_gpu ? torch::Device(args.device)
                               : args.device == "cuda" ? cpprun::local_device() : torch::Device(torch::kCPU);
  if (args.device == "cuda" && !device.is_cuda()) {
    throw std::invalid_argument("--device cuda: no GPU for LOCAL_RANK here (a CPU-only LibTorch, or fewer GPUs than ranks)");
  }
  if (shared_gpu && (!torch::cuda::is_available() || device.index() >= torch::cuda::device_count())) {
    throw std::invalid_argument("--device " + args.device + ": no such GPU here");
  }
  torch::set_num_threads(1);
  cpprun::ProcessGroupOptions group_options;
  if (shared_gpu) group_options.backend = cpprun::Backend::kGloo;  // NCCL refuses two ranks on one GPU
  auto group = cpprun::init_process_group(group_options);
  const double rss_before_model = resident_mb();
  const auto dtype = args.check ? torch::kDouble : torch::kFloat;
  torch::manual_seed(0);
  auto net = bench::make_mlp(args.hidden);
  net->to(device, dtype);
  // One global batch, the same on every rank; each trains on its slice.
  const int64_t global_batch = args.batch * group.size();
  auto global_x = torch::randn({global_batch, 1024}).to(device, dtype);
  auto global_y = torch::randint(0, 10, {global_batch}, torch::kLong).to(device);
  auto x = global_x.narrow(0, group.rank() * args.batch, args.batch);
  auto y = global_y.narrow(0, group.rank() * args.batch, args.batch);
  // --check's one-process copy, from the same initial weights. Frozen after cloning: a clone's
  // parameters require gradients whatever the original's do.
  torch::nn::Sequential reference(nullptr);
  if (args.check) reference = torch::nn::Sequential(std::dynamic_pointer_cast<torch::nn::SequentialImpl>(net->clone()));
  if (args.frozen) {
    bench::freeze_all_weights_but_the_head(net);
    if (reference) bench::freeze_all_weights_but_the_head(reference);
  }
  // Kernels on a GPU run asynchronously: wait for them before reading the clock.
  auto finish_kernels = [&] {
    if (device.is_cuda()) torch::cuda::synchronize(device.index());
  };

  auto time_steps = [&](const std::function<void()>& step) {
    for (int i = 0; i < args.warmup; ++i) step();
    finish_kernels();
    cpprun::barrier(group);
    const double cpu_start = cpu_ms();
    const auto start = std::chrono::steady_clock::now();
    cpprun::StepTimer step_timer;
    for (int i = 0; i < args.steps; ++i) step(), step_timer.step_done();
    finish_kernels();
    cpprun::barrier(group);
    Timing t;
    t.wall_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() / args.steps;
    t.cpu_ms = (cpu_ms() - cpu_start) / args.steps;
    const auto report = step_timer.report(group);  // after the clocks are read: not timed
    if (group.rank() == 0) std::printf("%s\n", cpprun::format_step_report(report).c_str());
    return t;
  };
  auto run = [&](auto& model) {
    torch::optim::SGD opt(model->parameters(), sgd_options());
    return time_steps([&] { train_step(model, opt, x, y); });
  };

  int64_t params = 0;
  for (const auto& p : net->parameters()) params += p.numel();
  Timing t;
  cpprun::DataParallel<torch::nn::SequentialImpl> parallel = nullptr;  // ddp and zero modes
  if (args.mode == "ddp") {
    parallel = cpprun::DistributedDataParallel(net.ptr(), group,
                                                    cpprun::DdpOptions().gradient_as_bucket_view(args.bucket_view));
  } else if (args.mode == "zero1" || args.mode == "zero2" || args.mode == "zero3") {
    auto per_linear = [](const torch::nn::Module& m) { return dynamic_cast<const torch::nn::LinearImpl*>(&m) != nullptr; };
    auto options = cpprun::FsdpOptions().stage(args.mode.back() - '0').wrap_policy(per_linear);
    parallel = cpprun::FullyShardedDataParallel(net.ptr(), group, options);
  }
  if (parallel) {
    t = run(parallel);
  } else if (args.mode == "local") {
    t = run(net);
  } else if (args.mode == "allreduce") {
    auto gradients = torch::randn({params}).to(device);
    t = time_steps([&] { cpprun::all_reduce(group, gradients, cpprun::ReduceOp::kAvg); });
  } else {
    throw std::invalid_argument("--mode must be ddp, zero1, zero2, zero3, local or allreduce");
  }
  bool ok = true;
  if (args.check) {
    torch::optim::SGD opt(reference->parameters(), sgd_options());
    for (int i = 0; i < args.warmup + args.steps; ++i) train_step(reference, opt, global_x, global_y);
    parallel->gather_full_parameters();  // FSDP: net's full parameters up to date
    ok = matches_reference(*net, *reference, group.rank());
  }
  if (group.rank() == 0) {
    std::printf("RESULT impl=cpprun mode=%s device=%s params=%lld frozen=%d world=%d ms_per_step=%.2f "
                "cpu_ms_per_step=%.2f samples_per_s=%.1f peak_rss_mb=%.1f\n",
                args.mode.c_str(), args.device.c_str(), static_cast<long long>(params), args.frozen ? 1 : 0,
                group.size(), t.wall_ms, t.cpu_ms,
                1000.0 * args.batch * group.size() / t.wall_ms, peak_resident_mb() - rss_before_model);
  }
  return ok ? 0 : 1;
}

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dp_bench: %s\n", e.what());
    return 2;
  }
}
