// Data-parallel training of a small MLP, written with cpprun's collectives only: each rank
// trains on its slice of every global batch, gradients are averaged with one all-reduce, and
// every rank takes the same optimizer step. (DistributedDataParallel will do the averaging
// for you, overlapped with backward; this shows what it does.)
//
//   single process:  ./build/examples/train_mlp
//   two ranks:       ./build/launcher/cpprun --nproc_per_node=2 ./build/examples/train_mlp
//   options:         ./build/examples/train_mlp --help
#include <cpprun/cpprun.h>
#include <torch/torch.h>

#include <cstdio>
#include <sstream>
#include <string>

#include "flag_value.h"

constexpr const char* kUsage = R"(usage: train_mlp [options]
  --steps N          optimizer steps (default 300)
  --global-batch B   examples per step over all ranks; must divide by the world size (default 256)
  --lr X             SGD's learning rate (default 0.05)
  --float64          train in double precision and print the losses to 12 digits: the curve on N
                     ranks then equals the single-process one to rounding (tests/examples/run_parity.cmake)
  --help             this text
)";

// The three interleaved spirals this trains on hold this many points.
constexpr int64_t kPoints = 60000;

struct Options {
  int steps = 300;
  int global_batch = 256;
  double lr = 0.05;
  bool float64 = false;
  bool help = false;
};

Options parse(int argc, char** argv) {
  Options o;
  for (examples::Flags flags(argc, argv, "train_mlp"); flags.next();) {
    if (flags.is("--help") || flags.is("-h")) o.help = true;
    else if (flags.is("--steps")) o.steps = flags.number(1);
    else if (flags.is("--global-batch")) o.global_batch = flags.number(1);
    else if (flags.is("--lr")) o.lr = flags.number(1e-12);
    else if (flags.is("--float64")) o.float64 = true;
    else flags.unknown();
  }
  if (o.global_batch >= kPoints) {
    throw std::invalid_argument("--global-batch " + std::to_string(o.global_batch) + " must be below the " +
                                std::to_string(kPoints) + " points of the data set");
  }
  return o;
}

// Three interleaved spirals: a task a linear model cannot solve, so a falling loss means learning.
std::pair<torch::Tensor, torch::Tensor> spirals(int64_t n, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto label = torch::randint(0, 3, {n}, gen, torch::kLong);
  auto radius = torch::rand({n}, gen);
  auto angle = radius * 4.0 + label.to(torch::kFloat) * (2.0 * M_PI / 3) + torch::randn({n}, gen) * 0.2;
  auto points = torch::stack({radius * torch::cos(angle), radius * torch::sin(angle)}, 1);
  return {points, label};
}

struct Mlp : torch::nn::Module {
  torch::nn::Sequential body{torch::nn::Linear(2, 64), torch::nn::ReLU(), torch::nn::Linear(64, 64),
                             torch::nn::ReLU(), torch::nn::Linear(64, 3)};
  Mlp() { register_module("body", body); }
  torch::Tensor forward(torch::Tensor x) { return body->forward(x); }
};

int run(int argc, char** argv) {
  const Options opt = parse(argc, argv);
  if (opt.help) return examples::print_usage(kUsage);
  auto group = cpprun::init_process_group();
  const int rank = group.rank(), world = group.size();
  if (opt.global_batch % world != 0) {
    throw std::invalid_argument("--global-batch " + std::to_string(opt.global_batch) +
                                " must divide by the world size " + std::to_string(world));
  }
  const int local_batch = opt.global_batch / world;
  torch::manual_seed(0);  // same initial weights everywhere; we still broadcast to be sure
  auto model = std::make_shared<Mlp>();
  const auto dtype = opt.float64 ? torch::kDouble : torch::kFloat;
  model->to(dtype);
  for (auto& p : model->parameters()) cpprun::broadcast(group, p.detach(), 0);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(opt.lr).momentum(0.9));

  auto [points, labels] = spirals(kPoints, /*seed=*/1);
  points = points.to(dtype);
  double first_loss = 0, loss_sum = 0;
  int loss_count = 0;
  for (int step = 0; step < opt.steps; ++step) {
    // This rank's slice of global batch `step`.
    const int64_t start = (static_cast<int64_t>(step) * opt.global_batch) % (points.size(0) - opt.global_batch);
    auto x = points.narrow(0, start + rank * local_batch, local_batch);
    auto y = labels.narrow(0, start + rank * local_batch, local_batch);

    optimizer.zero_grad();
    auto loss = torch::nn::functional::cross_entropy(model->forward(x), y);
    loss.backward();

    // Average the gradients over ranks with one all-reduce of a flat buffer.
    std::vector<torch::Tensor> grads;
    for (auto& p : model->parameters()) grads.push_back(p.grad().view(-1));
    auto flat = torch::cat(grads);
    cpprun::all_reduce(group, flat, cpprun::ReduceOp::kAvg);
    int64_t offset = 0;
    for (auto& p : model->parameters()) {
      p.grad().view(-1).copy_(flat.narrow(0, offset, p.numel()));
      offset += p.numel();
    }
    optimizer.step();

    // The loss of the whole global batch: the ranks' local losses averaged.
    auto global_loss = loss.detach().clone();
    cpprun::all_reduce(group, global_loss, cpprun::ReduceOp::kAvg);
    const double value = global_loss.item<double>();
    if (step == 0) first_loss = value;
    loss_sum += value, ++loss_count;
    if (rank == 0 && ((step + 1) % 50 == 0 || step + 1 == opt.steps)) {
      std::printf("step %4d/%d  loss %.*f  (world size %d, %d samples per rank)\n", step + 1, opt.steps,
                  opt.float64 ? 12 : 4, loss_sum / loss_count, world, local_batch);
      std::fflush(stdout);
      loss_sum = 0, loss_count = 0;
    }
  }

  // Every rank must hold the same model: compare a checksum with rank 0's.
  torch::NoGradGuard no_grad;
  auto checksum = torch::zeros({1}, torch::kDouble);
  for (auto& p : model->parameters()) checksum += p.to(torch::kDouble).sum();
  auto rank0_checksum = checksum.clone();
  cpprun::broadcast(group, rank0_checksum, 0);
  // Bit for bit, so that replicas diverged alike to NaN are still in sync (NaN != NaN).
  const bool in_sync = checksum.view(torch::kLong).equal(rank0_checksum.view(torch::kLong));
  auto accuracy = (model->forward(points).argmax(1) == labels).to(torch::kDouble).mean().item<double>();
  if (rank == 0) {
    std::printf("first loss %.4f, accuracy %.1f%%, replicas %s\n", first_loss, 100 * accuracy,
                in_sync ? "in sync" : "DIFFER");
  }
  return in_sync ? 0 : 1;
}

// Any error (a bad option, a failed collective) ends with its message and exit code 1, written
// where cpprun's failure summary shows it (cpprun::record), rather than an abort.
int main(int argc, char** argv) { return cpprun::record([&] { return run(argc, argv); }); }
