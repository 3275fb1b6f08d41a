// DistributedDataParallel under `cpprun --nproc_per_node=K`. Each rank trains the DDP model on
// its slice of every global batch and, alongside, a reference model in one process on the whole
// global batch; both must end with the same parameters. Checks use CHECK, not REQUIRE, so every
// rank keeps making the same collective calls even when one fails.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <functional>

#include "cpprun/cpprun.h"
#include "ddp_test_models.h"

using namespace ddp_test;

namespace {

const cpprun::ProcessGroup& group() {
  static const cpprun::ProcessGroup pg = [] {
    cpprun::ProcessGroupOptions options;
    options.timeout = std::chrono::seconds(60);
    return cpprun::init_process_group(options);
  }();
  return pg;
}

constexpr int64_t kGlobalBatch = 24;  // divides by 1, 2, 3 and 4 ranks

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string& kind, std::vector<torch::Tensor> params) {
  if (kind == "sgd") {
    return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.05).momentum(0.9));
  }
  return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(1e-3));
}

// Rank r's part of a global batch.
torch::Tensor slice(const torch::Tensor& global, int rank, int world) {
  const int64_t per_rank = global.size(0) / world;
  return global.narrow(0, rank * per_rank, per_rank);
}

void check_same_parameters(torch::nn::Module& trained, torch::nn::Module& reference, double tolerance) {
  auto ref = reference.named_parameters();
  for (const auto& item : trained.named_parameters()) {
    const double diff = relative_difference(item.value(), ref[item.key()]);
    INFO("parameter " << item.key() << " relative difference " << diff);
    CHECK(diff <= tolerance);
  }
}

// Reference gradients for the whole global batch: the mean of each rank's slice's loss, which
// is what DDP's averaged gradients correspond to. BatchNorm's running statistics end as rank 0's
// forward leaves them, since DDP broadcasts rank 0's buffers. Each slice's backward runs before
// the buffers are restored, since autograd saved them for it.
template <typename Net>
void reference_backward(Net& ref, const torch::Tensor& x, const torch::Tensor& y, int world) {
  std::vector<torch::Tensor> saved;
  for (const auto& b : ref.buffers()) saved.push_back(b.clone());
  for (int r = world - 1; r >= 0; --r) {
    if (r == 0) {  // restore, so that only rank 0's slice updates the running statistics
      torch::NoGradGuard no_grad;
      auto buffers = ref.buffers();
      for (std::size_t i = 0; i < buffers.size(); ++i) buffers[i].copy_(saved[i]);
    }
    auto loss = torch::nn::functional::cross_entropy(ref.forward(slice(x, r, world)), slice(y, r, world));
    (loss / world).backward();
  }
}

template <typename Net>
void check_parity(const std::string& model, const std::string& optimizer, cpprun::DdpOptions options,
                  int steps = 5, std::shared_ptr<cpprun::CommHook> hook = nullptr, double tolerance = 1e-5) {
  const int rank = group().rank(), world = group().size();
  torch::manual_seed(100 + rank);  // different initial weights on each rank: DDP must broadcast rank 0's
  auto net = std::make_shared<Net>();
  auto ddp = cpprun::DistributedDataParallel(net, group(), options);
  if (hook) ddp->register_comm_hook(hook);
  auto ref = std::make_shared<Net>();
  copy_state(*ref, *net);
  auto opt = make_optimizer(optimizer, ddp->parameters());
  auto ref_opt = make_optimizer(optimizer, ref->parameters());

  for (int step = 0; step < steps; ++step) {
    auto x = inputs_for(model, kGlobalBatch, step);
    auto y = targets_for(kGlobalBatch, step);
    opt->zero_grad();
    torch::nn::functional::cross_entropy(ddp->forward(slice(x, rank, world)), slice(y, rank, world)).backward();
    opt->step();
    ref_opt->zero_grad();
    reference_backward(*ref, x, y, world);
    ref_opt->step();
  }
  check_same_parameters(*net, *ref, tolerance);
  if (rank == 0) {  // rank 0's buffers are the ones DDP keeps
    auto ref_buffers = ref->named_buffers();
    for (const auto& item : net->named_buffers()) {
      INFO("buffer " << item.key());
      CHECK(relative_difference(item.value(), ref_buffers[item.key()]) <= tolerance);
    }
  }
}

}  // namespace

TEST_CASE("ddp: MLP with SGD-momentum matches one process on the global batch", "[ddp]") {
  check_parity<Mlp>("mlp", "sgd", cpprun::DdpOptions());
}

TEST_CASE("ddp: MLP with Adam matches one process on the global batch", "[ddp]") {
  check_parity<Mlp>("mlp", "adam", cpprun::DdpOptions());
}

TEST_CASE("ddp: CNN with BatchNorm, SGD-momentum and Adam", "[ddp]") {
  check_parity<SmallCnn>("cnn", "sgd", cpprun::DdpOptions());
  check_parity<SmallCnn>("cnn", "adam", cpprun::DdpOptions());
}

TEST_CASE("ddp: many small buckets, rebuilt after the first backward", "[ddp]") {
  check_parity<Mlp>("mlp", "sgd", cpprun::DdpOptions().bucket_cap_mb(0.002).first_bucket_cap_mb(0.001));
  check_parity<SmallCnn>("cnn", "adam", cpprun::DdpOptions().bucket_cap_mb(0.001).first_bucket_cap_mb(0.001));
}

TEST_CASE("ddp: gradient_as_bucket_view gives the same training", "[ddp]") {
  check_parity<Mlp>("mlp", "sgd", cpprun::DdpOptions().gradient_as_bucket_view(true).bucket_cap_mb(0.002));
  check_parity<SmallCnn>("cnn", "adam", cpprun::DdpOptions().gradient_as_bucket_view(true));
}

TEST_CASE("ddp: fp16 and bf16 compression hooks train within their precision", "[ddp]") {
  check_parity<Mlp>("mlp", "sgd", cpprun::DdpOptions(), 3, cpprun::fp16_compress_hook(), 2e-3);
  check_parity<Mlp>("mlp", "sgd", cpprun::DdpOptions(), 3, cpprun::bf16_compress_hook(), 2e-2);
}
