// The C++ side of powersgd_resume.sh: cpprun's DDP with cpprun::powerSGD_hook, stopped and resumed
// through save_powerSGD_state / load_powerSGD_state, from DIR/init.safetensors on
// DIR/batches.safetensors (powersgd_resume.py init wrote them).
//   cpprun --nproc_per_node=2 powersgd_resume full DIR CONFIG       8 steps; the model (rank 0) and each
//        rank's PowerSGD state after steps 2 and 5; DIR/CONFIG_full.safetensors at the end
//   cpprun --nproc_per_node=2 powersgd_resume resume DIR CONFIG K [nostate|strided]   a new model, DDP and
//        hook from step K's files (strided: their copies by powersgd_resume.py craft), trained to step 8:
//        DIR/CONFIG_resumed_K[_nostate|_strided].safetensors
//   cpprun --nproc_per_node=2 powersgd_resume refuse DIR            files that do not fit are refused
//   cpprun --nproc_per_node=1 powersgd_resume refuse_world DIR      a 2-rank file at world size 1
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <string>

#include "cpprun/cpprun.h"
#include "interop_files.h"

namespace {

constexpr int kSteps = 8;

// powersgd_resume.py's CONFIGS, the same: PowerSGD from step 3 (iter 3), warm-started at rank 1;
// and cold (new random Q every step, so the random numbers' state matters) at rank 3 by QR.
const std::map<std::string, cpprun::PowerSGDOptions> kConfigs{
    {"warm", cpprun::PowerSGDOptions().matrix_approximation_rank(1).start_powerSGD_iter(3)},
    {"cold", cpprun::PowerSGDOptions().matrix_approximation_rank(3).start_powerSGD_iter(3).min_compression_rate(1)
                 .warm_start(false).random_seed(5)},
    {"buckets", cpprun::PowerSGDOptions().matrix_approximation_rank(2).start_powerSGD_iter(3)},
};
// "buckets" spreads the model's 6,048 bytes of gradients over buckets of 600e-6 MiB (four; one
// otherwise): a state of several buckets, and buckets whose all-reduces are in flight together.
constexpr double kSmallBucketsMb = 600e-6;

torch::nn::Sequential net() {
  torch::nn::Sequential model(torch::nn::Linear(8, 16), torch::nn::Tanh(), torch::nn::Linear(16, 16), torch::nn::Tanh(),
                              torch::nn::Linear(16, 16), torch::nn::Tanh(), torch::nn::Linear(16, 4));
  model->to(torch::kDouble);
  return model;
}

std::string state_file(const std::string& dir, const std::string& config, int step, int rank) {
  return dir + "/" + config + "_powersgd_" + std::to_string(step) + "_rank" + std::to_string(rank) + ".pt";
}

struct Run {
  std::string dir;
  cpprun::ProcessGroup group;
  std::map<std::string, at::Tensor> batches;

  // Steps [from, to) of DDP over `model` with `hook`; after each, `after(step done)`.
  template <typename Model>
  void train(Model& ddp, int from, int to, const std::function<void(int)>& after = {}) {
    torch::optim::SGD opt(ddp->parameters(), 0.1);
    const std::string r = std::to_string(group.rank());
    for (int s = from; s < to; ++s) {
      opt.zero_grad();
      const std::string at = r + "_" + std::to_string(s);
      torch::mse_loss(ddp->forward(batches.at("x" + at)), batches.at("y" + at)).backward();
      opt.step();
      if (after) after(s + 1);
    }
  }
};

// Expects `body` to throw a message containing `expected`; prints it. False (and says so) if not.
bool refused(const char* what, const std::string& expected, const std::function<void()>& body) {
  try {
    body();
  } catch (const std::exception& e) {
    const std::string message = e.what();
    if (message.find(expected) != std::string::npos) {
      std::printf("refused as expected (%s): %s\n", what, message.substr(0, message.find('\n')).c_str());
      return true;
    }
    std::printf("FAIL (%s): refused, but without \"%s\": %s\n", what, expected.c_str(), message.c_str());
    return false;
  }
  std::printf("FAIL (%s): not refused\n", what);
  return false;
}

// Whether the time since `start` is under `seconds`; says so if not.
bool within_seconds(std::chrono::steady_clock::time_point start, double seconds) {
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (took < seconds) return true;
  std::printf("FAIL: refused after %.1f s, not within %.0f s\n", took, seconds);
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 2 ? argv[1] : "";
  const bool modes_ok = ((mode == "full" && argc == 4) ||
                         (mode == "resume" && (argc == 5 || (argc == 6 && (std::string(argv[5]) == "nostate" ||
                                                                          std::string(argv[5]) == "strided")))) ||
                         ((mode == "refuse" || mode == "refuse_world") && argc == 3)) &&
                        (argc < 4 || kConfigs.count(argv[3]));
  if (!modes_ok) {
    std::fprintf(stderr, "usage: powersgd_resume full DIR CONFIG | resume DIR CONFIG K [nostate|strided] | refuse DIR | "
                         "refuse_world DIR (CONFIG: warm, cold or buckets)\n");
    return 2;
  }
  Run run{argv[2], cpprun::init_process_group(), {}};
  run.batches = interop::read_tensors(run.dir + "/batches.safetensors");
  const int rank = run.group.rank();
  const std::string& dir = run.dir;

  if (mode == "full" || mode == "resume") {
    const std::string config = argv[3];
    const int from = mode == "resume" ? std::stoi(argv[4]) : 0;
    auto model = net();
    cpprun::load_state_dict(model, from == 0 ? dir + "/init.safetensors"
                                             : dir + "/" + config + "_model_" + std::to_string(from) + ".safetensors");
    auto hook = cpprun::powerSGD_hook(kConfigs.at(config));
    const std::string variant = argc == 6 ? argv[5] : "";
    if (mode == "resume" && variant != "nostate") {
      const std::string file = state_file(dir, config, from, rank);
      // torch.save's copy with strided tensors (powersgd_resume.py craft)
      cpprun::load_powerSGD_state(*hook, variant == "strided" ? file.substr(0, file.size() - 3) + "_strided.pt" : file);
    }
    const auto buckets =
        config == "buckets" ? cpprun::DdpOptions().bucket_cap_mb(kSmallBucketsMb) : cpprun::DdpOptions();
    auto ddp = cpprun::DistributedDataParallel(model.ptr(), run.group, buckets);
    ddp->register_comm_hook(hook);
    run.train(ddp, from, kSteps, [&](int done) {
      if (mode != "full" || (done != 2 && done != 5)) return;
      cpprun::save_powerSGD_state(*hook, state_file(dir, config, done, rank));
      const std::string model_file = dir + "/" + config + "_model_" + std::to_string(done) + ".safetensors";
      if (rank == 0) cpprun::save_state_dict(model, model_file);
    });
    const std::string out = mode == "full" ? "full" : "resumed_" + std::to_string(from) + (argc == 6 ? "_" + variant : "");
    if (rank == 0) cpprun::save_state_dict(model, dir + "/" + config + "_" + out + ".safetensors");
    cpprun::barrier(run.group);
    return 0;
  }

  // A fresh model, DDP and hook from the warm run's step-5 files, trained one step: the first
  // backward meets the buckets. `ddp_options` sets the buckets; `file`, if given, replaces the file;
  // a `file_rank` of -1 loads none.
  auto resume_one_step = [&](const cpprun::PowerSGDOptions& options, int file_rank, cpprun::DdpOptions ddp_options,
                             const std::string& file = "") {
    auto model = net();
    cpprun::load_state_dict(model, dir + "/warm_model_5.safetensors");
    auto hook = cpprun::powerSGD_hook(options);
    if (file_rank >= 0) cpprun::load_powerSGD_state(*hook, file.empty() ? state_file(dir, "warm", 5, file_rank) : file);
    auto ddp = cpprun::DistributedDataParallel(model.ptr(), run.group, ddp_options);
    ddp->register_comm_hook(hook);
    run.train(ddp, 5, 6);
  };
  const cpprun::PowerSGDOptions warm = kConfigs.at("warm");
  bool ok = true;
  if (mode == "refuse_world") {
    ok &= refused("a file from world size 2 at world size 1", "was made on rank 0 of 2; this is rank 0 of 1",
                  [&] { resume_one_step(warm, 0, {}); });
  } else {
    auto other_rank = cpprun::PowerSGDOptions(warm).matrix_approximation_rank(2);
    ok &= refused("another matrix_approximation_rank", "matrix_approximation_rank 1 (this hook: 2)",
                  [&] { resume_one_step(other_rank, rank, {}); });
    auto other_start = cpprun::PowerSGDOptions(warm).start_powerSGD_iter(4).use_error_feedback(false);
    ok &= refused("other start_powerSGD_iter and use_error_feedback",
                  "start_powerSGD_iter 3 (this hook: 4); use_error_feedback true (this hook: false)",
                  [&] { resume_one_step(other_start, rank, {}); });
    ok &= refused("another hook", "the hook is fp16_compress", [&] {
      cpprun::load_powerSGD_state(*cpprun::fp16_compress_hook(), state_file(dir, "warm", 5, rank));
    });
    const std::string other_file = dir + "/not_powersgd_rank" + std::to_string(rank) + ".pt";
    interop::write_tensors(other_file, {{"weight", torch::ones({2})}});
    ok &= refused("not a PowerSGD state", "no \"iter\"", [&] {
      cpprun::load_powerSGD_state(*cpprun::powerSGD_hook(warm), other_file);
    });
    // torch.save's expanded tensor: 1,000 zeros in 8 bytes of storage, read as 1,000 empty shapes.
    ok &= refused("bucket shapes from an expanded tensor", "was made for a bucket 0 of shapes [], [], []", [&] {
      resume_one_step(warm, rank, {}, dir + "/expanded_rank" + std::to_string(rank) + ".pt");
    });
    // Many buckets, where the file had one.
    ok &= refused("another bucket layout", "was made for a bucket 0 of shapes",
                  [&] { resume_one_step(warm, rank, cpprun::DdpOptions().bucket_cap_mb(kSmallBucketsMb)); });
    ok &= refused("the other rank's file", "was made on rank " + std::to_string(1 - rank) + " of 2; this is rank " +
                                               std::to_string(rank) + " of 2",
                  [&] { resume_one_step(warm, 1 - rank, {}); });
    // One rank's state refused, the other's not: every rank throws the refusing rank's reason at
    // once, before the bucket's collectives, rather than the others waiting for it in them until
    // the group's timeout (Note [A PowerSGD state fits one layout]).
    const std::string rank1_reason = "was made on rank 0 of 2; this is rank 1 of 2";
    auto start = std::chrono::steady_clock::now();
    ok &= refused("rank 1 given rank 0's file", rank1_reason, [&] { resume_one_step(warm, 0, {}); });
    ok &= within_seconds(start, 10);
    start = std::chrono::steady_clock::now();
    ok &= refused("a state loaded on rank 0 only", "at different steps (rank 0 at 5, rank 1 at 0)",
                  [&] { resume_one_step(warm, rank == 0 ? 0 : -1, {}); });
    ok &= within_seconds(start, 10);
    ok &= refused("a state loaded into a hook that ran", "this hook has already run", [&] {
      auto hook = cpprun::powerSGD_hook(warm);
      auto model = net();
      auto ddp = cpprun::DistributedDataParallel(model.ptr(), run.group);
      ddp->register_comm_hook(hook);
      run.train(ddp, 5, 6);
      cpprun::load_powerSGD_state(*hook, state_file(dir, "warm", 5, rank));
    });
    // And what fits still trains after all those (nothing was left half done).
    resume_one_step(warm, rank, {});
  }
  std::fflush(stdout);
  cpprun::barrier(run.group);
  return ok ? 0 : 1;
}
