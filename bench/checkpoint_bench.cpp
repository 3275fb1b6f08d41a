// scripts/bench_checkpoint.sh's program: a sharded checkpoint of model + optimizer, saved and
// loaded, for a stack of Linear(H, H) + ReLU layers (H 2048 x 12 layers: 50M parameters, 201 MB;
// with AdamW's exp_avg and exp_avg_sq, 604 MB a save) under DDP or FSDP stage 3 (one unit per
// Linear), AdamW stepped once first so that its state exists. Times, medians over --repeats:
//   save   save_state_dict(model, DIR/, o) + save_optimizer_state_dict(model, opt, DIR/, o), one
//          o = StateDictSaveOptions().save_id(new_save_id()), into an emptied DIR (every rank
//          writes its files, each fsynced);
//   load   load_state_dict(model, DIR/) + load_optimizer_state_dict(model, opt, DIR/), after
//          rank 0 drops the page cache (--drop-caches: sync, then 1 > /proc/sys/vm/drop_caches,
//          root only; "cache=cold" when it did, else "warm");
//   async  save_async(model, opt, DIR/, DIR/, o): how long the call blocks the training thread,
//          how long until the save is done on every rank, and the training steps run meanwhile
//          against steps with no save in flight.
// Each phase runs between barriers, so its time is the slowest rank's. The first load is checked:
// every parameter and AdamW state tensor, changed after the save, is bit for bit the saved one
// after the load ("roundtrip=ok"; else "roundtrip=FAIL" and exit 1). Prints one RESULT line
// (rank 0's); bytes are the files in DIR after a save, GB = 1e9 bytes; save_cpu_s and load_cpu_s
// are rank 0's process CPU time (every thread) over the save and the load.
//
//   cpprun --nproc_per_node=2 build/bench/checkpoint_bench --mode ddp --dir /tmp/ckpt_bench/
//          [--hidden 2048] [--layers 12] [--repeats 3] [--batch 16] [--drop-caches]
#include <cpprun/cpprun.h>
#include <torch/torch.h>

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "median.h"

namespace {

using bench::median;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double process_cpu_s() {  // this process's user + system time so far, every thread
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  auto s = [](const timeval& t) { return t.tv_sec + t.tv_usec / 1e6; };
  return s(usage.ru_utime) + s(usage.ru_stime);
}

struct Args {
  std::string mode = "ddp", dir = "/tmp/cpprun_checkpoint_bench/";
  int64_t hidden = 2048, layers = 12, batch = 16;
  int repeats = 3;
  bool drop_caches = false;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--drop-caches") {
      a.drop_caches = true;
      continue;
    }
    if (i + 1 >= argc) throw std::invalid_argument(k + " needs a value");
    const std::string v = argv[++i];
    if (k == "--mode") a.mode = v;
    else if (k == "--dir") a.dir = v;
    else if (k == "--hidden") a.hidden = std::stoll(v);
    else if (k == "--layers") a.layers = std::stoll(v);
    else if (k == "--batch") a.batch = std::stoll(v);
    else if (k == "--repeats") a.repeats = std::stoi(v);
    else throw std::invalid_argument("unknown flag " + k + " (--mode, --dir, --hidden, --layers, --batch, --repeats, --drop-caches)");
  }
  if (a.mode != "ddp" && a.mode != "zero3") throw std::invalid_argument("--mode must be ddp or zero3, not '" + a.mode + "'");
  if (a.dir.empty() || a.dir.back() != '/') a.dir += '/';  // a directory: Hugging Face's sharded layout
  if (a.repeats < 1) throw std::invalid_argument("--repeats must be at least 1");
  return a;
}

// Rank 0 empties the page cache (so that a load reads the disk); false where it may not.
bool drop_page_cache() {
  ::sync();
  std::ofstream out("/proc/sys/vm/drop_caches");
  out << "1\n";
  out.flush();
  return static_cast<bool>(out);
}

uint64_t bytes_under(const std::string& dir) {
  uint64_t total = 0;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.is_regular_file()) total += entry.file_size();
  return total;
}

// This rank's parameters and AdamW state (exp_avg, exp_avg_sq) in a fixed order.
std::vector<torch::Tensor> local_state(const std::vector<torch::Tensor>& params, torch::optim::AdamW& opt) {
  std::vector<torch::Tensor> out;
  for (const auto& p : params) {
    out.push_back(p);
    const auto it = opt.state().find(p.unsafeGetTensorImpl());
    if (it == opt.state().end()) continue;
    auto& s = static_cast<torch::optim::AdamWParamState&>(*it->second);
    out.push_back(s.exp_avg());
    out.push_back(s.exp_avg_sq());
  }
  return out;
}

int run(int argc, char** argv) {
  const Args args = parse(argc, argv);
  torch::set_num_threads(1);
  auto group = cpprun::init_process_group();
  const bool rank0 = group.rank() == 0;
  torch::manual_seed(0);
  torch::nn::Sequential net;
  for (int64_t i = 0; i < args.layers; ++i)
    net->push_back(torch::nn::Linear(args.hidden, args.hidden)), net->push_back(torch::nn::ReLU());
  int64_t params = 0;
  for (const auto& p : net->parameters()) params += p.numel();

  cpprun::DataParallel<torch::nn::SequentialImpl> model = nullptr;
  if (args.mode == "ddp") {
    model = cpprun::DistributedDataParallel(net.ptr(), group);
  } else {
    auto per_linear = [](const torch::nn::Module& m) { return dynamic_cast<const torch::nn::LinearImpl*>(&m) != nullptr; };
    model = cpprun::FullyShardedDataParallel(net.ptr(), group, cpprun::FsdpOptions().stage(3).wrap_policy(per_linear));
  }
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-3));
  const auto x = torch::randn({args.batch, args.hidden});
  const auto y = torch::randn({args.batch, args.hidden});
  auto step = [&] {
    const auto start = Clock::now();
    opt.zero_grad();
    torch::mse_loss(model->forward(x), y).backward();
    opt.step();
    return seconds_since(start);
  };
  auto timed = [&](auto&& phase) {  // between barriers: the slowest rank's time
    cpprun::barrier(group);
    const auto start = Clock::now();
    phase();
    cpprun::barrier(group);
    return seconds_since(start);
  };
  auto empty_dir = [&] {
    if (rank0) fs::remove_all(args.dir);
    cpprun::barrier(group);
  };

  step();  // AdamW's state exists from here
  step();  // warm-up

  std::vector<double> save_model, save_opt, save_total, load_model, load_opt, load_total, save_cpu, load_cpu;
  uint64_t bytes = 0;
  bool cold = args.drop_caches, roundtrip_ok = true;
  for (int r = 0; r < args.repeats; ++r) {
    empty_dir();
    const auto options = cpprun::StateDictSaveOptions().save_id(cpprun::new_save_id());
    double cpu = process_cpu_s();
    save_model.push_back(timed([&] { cpprun::save_state_dict(model, args.dir, options); }));
    save_opt.push_back(timed([&] { cpprun::save_optimizer_state_dict(model, opt, args.dir, options); }));
    save_total.push_back(save_model.back() + save_opt.back());
    save_cpu.push_back(process_cpu_s() - cpu);
    if (rank0) bytes = bytes_under(args.dir);

    std::vector<torch::Tensor> saved;
    if (r == 0) {  // change everything, so that the load has to put it back
      torch::NoGradGuard no_grad;
      for (const auto& t : local_state(model->parameters(), opt)) saved.push_back(t.clone()), t.add_(1.0);
    }
    if (args.drop_caches) {
      if (rank0) cold = drop_page_cache() && cold;
      cpprun::barrier(group);
    }
    cpu = process_cpu_s();
    load_model.push_back(timed([&] { cpprun::load_state_dict(model, args.dir); }));
    load_opt.push_back(timed([&] { cpprun::load_optimizer_state_dict(model, opt, args.dir); }));
    load_total.push_back(load_model.back() + load_opt.back());
    load_cpu.push_back(process_cpu_s() - cpu);
    if (r == 0) {
      const auto now = local_state(model->parameters(), opt);
      roundtrip_ok = now.size() == saved.size();
      for (size_t i = 0; roundtrip_ok && i < now.size(); ++i) roundtrip_ok = torch::equal(now[i], saved[i]);
      auto all_ok = torch::tensor({roundtrip_ok ? 1 : 0}, torch::kInt);
      cpprun::all_reduce(group, all_ok, cpprun::ReduceOp::kMin);
      roundtrip_ok = all_ok.item<int>() == 1;
    }
  }

  // Training with no save in flight, then with a background save: the ranks step until every
  // rank's save is done (they agree on the count, as DDP and FSDP need every rank to step alike).
  std::vector<double> plain_steps;
  for (int i = 0; i < 3; ++i) plain_steps.push_back(step());
  std::vector<double> async_block, async_done, during_steps, spanned;
  for (int r = 0; r < args.repeats; ++r) {
    empty_dir();
    const auto options = cpprun::StateDictSaveOptions().save_id(cpprun::new_save_id());
    cpprun::barrier(group);
    const auto start = Clock::now();
    cpprun::AsyncSave pending = cpprun::save_async(model, opt, args.dir, args.dir, options);
    async_block.push_back(seconds_since(start));
    int steps = 0;
    for (;;) {
      auto done = torch::tensor({pending.done() ? 1 : 0}, torch::kInt);
      cpprun::all_reduce(group, done, cpprun::ReduceOp::kMin);
      if (done.item<int>() == 1 || steps >= 100) break;
      during_steps.push_back(step());
      ++steps;
    }
    pending.wait();
    async_done.push_back(seconds_since(start));
    spanned.push_back(steps);
  }

  if (rank0) {
    const double gb = static_cast<double>(bytes) / 1e9;
    std::printf("RESULT mode=%s world=%d params=%lld bytes=%llu cache=%s roundtrip=%s "
                "save_s=%.4f save_model_s=%.4f save_opt_s=%.4f save_cpu_s=%.4f save_gbps=%.3f "
                "load_s=%.4f load_model_s=%.4f load_opt_s=%.4f load_cpu_s=%.4f load_gbps=%.3f "
                "step_s=%.4f async_block_s=%.4f async_done_s=%.4f during_step_s=%.4f steps_during=%.0f\n",
                args.mode.c_str(), group.size(), static_cast<long long>(params), static_cast<unsigned long long>(bytes),
                cold ? "cold" : "warm", roundtrip_ok ? "ok" : "FAIL", median(save_total), median(save_model),
                median(save_opt), median(save_cpu), gb / median(save_total), median(load_total), median(load_model),
                median(load_opt), median(load_cpu), gb / median(load_total), median(plain_steps), median(async_block), median(async_done),
                median(during_steps), median(spanned));
    std::fflush(stdout);
  }
  cpprun::barrier(group);
  if (rank0) fs::remove_all(args.dir);
  return roundtrip_ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "checkpoint_bench: %s\n", e.what());
    return 2;
  }
}
