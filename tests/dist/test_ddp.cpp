// DistributedDataParallel under `cpprun --nproc_per_node=K`. Each rank trains the DDP model on
// its slice of every global batch and, alongside, a reference model in one process on the whole
// global batch; both must end with the same parameters, in float64 (Note [Parity in float64] in
// parity_checks.h). Checks use CHECK, not REQUIRE, so every rank keeps making the same collective
// calls even when one fails.
#include "catch.h"
#include <torch/torch.h>
#include <unistd.h>  // getppid

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "core/gradient_ready_hook.h"
#include "cpprun/cpprun.h"
#include "ddp/reducer.h"
#include "dist_test_support.h"
#include "ddp_test_models.h"
#include "parity_checks.h"

using namespace ddp_test;

namespace {

using dist_test::group;
using dist_test::slice;

constexpr int64_t kGlobalBatch = 24;  // divides by 1, 2, 3 and 4 ranks

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string& kind, std::vector<torch::Tensor> params) {
  if (kind == "sgd") {
    return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.05).momentum(0.9));
  }
  return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(1e-3));
}


// Reference gradients for the whole global batch: the mean of each rank's slice's loss, which
// is what DDP's averaged gradients correspond to. BatchNorm's running statistics end as the
// forward of `buffer_rank`'s slice leaves them: rank 0's, which DDP broadcasts, or under
// broadcast_buffers(false) each rank's own. Each slice's backward runs before the buffers are
// restored, since autograd saved them for it.
template <typename Net>
void reference_backward(Net& ref, const torch::Tensor& x, const torch::Tensor& y, int world, int buffer_rank = 0) {
  std::vector<torch::Tensor> saved;
  for (const auto& b : ref.buffers()) saved.push_back(b.clone());
  for (int k = 1; k <= world; ++k) {
    const int r = (buffer_rank + k) % world;  // buffer_rank's slice last
    if (r == buffer_rank) {  // restore, so that only its slice updates the running statistics
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
                  int steps = 5, std::shared_ptr<cpprun::CommHook> hook = nullptr,
                  double tolerance = kParityTolerance) {
  Float64Parity float64;
  const int rank = group().rank(), world = group().size();
  const int buffer_rank = options.broadcast_buffers() ? 0 : rank;
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
    reference_backward(*ref, x, y, world, buffer_rank);
    ref_opt->step();
  }
  check_same_parameters(*net, *ref, tolerance);
  if (rank == buffer_rank) {  // rank 0's buffers are the ones DDP keeps, unless each rank keeps its own
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

// PyTorch 2.15: a bucket_cap_mb given makes the first bucket that size too; 1 MiB only with the default.
TEST_CASE("ddp: the first bucket's size as PyTorch gives it", "[ddp]") {
  CHECK(cpprun::DdpOptions().first_bucket_cap_mb() == 1);
  CHECK(cpprun::DdpOptions().bucket_cap_mb() == 25);
  CHECK(cpprun::DdpOptions().bucket_cap_mb(4).first_bucket_cap_mb() == 4);
  CHECK(cpprun::DdpOptions().bucket_cap_mb(4).first_bucket_cap_mb(2).first_bucket_cap_mb() == 2);
  CHECK(cpprun::DdpOptions().first_bucket_cap_mb(2).bucket_cap_mb(4).first_bucket_cap_mb() == 2);
}

TEST_CASE("ddp: many small buckets, rebuilt after the first backward", "[ddp]") {
  check_parity<Mlp>("mlp", "sgd", cpprun::DdpOptions().bucket_cap_mb(0.002).first_bucket_cap_mb(0.001));
  check_parity<SmallCnn>("cnn", "adam", cpprun::DdpOptions().bucket_cap_mb(0.001).first_bucket_cap_mb(0.001));
}

// Registered c, a, b but run a -> b -> c: gradients become ready c's first, which is not the
// reverse registration order the first buckets guess.
struct OutOfOrder : torch::nn::Module {
  torch::nn::Linear c{nullptr}, a{nullptr}, b{nullptr};
  OutOfOrder() {
    c = register_module("c", torch::nn::Linear(16, 4));
    a = register_module("a", torch::nn::Linear(10, 16));
    b = register_module("b", torch::nn::Linear(16, 16));
  }
  torch::Tensor forward(torch::Tensor x) { return c(torch::relu(b(torch::relu(a(x))))); }
};

std::vector<std::size_t> flattened(const std::vector<std::vector<std::size_t>>& buckets) {
  std::vector<std::size_t> out;
  for (const auto& bucket : buckets) out.insert(out.end(), bucket.begin(), bucket.end());
  return out;
}

// White box: the Reducer driven as DdpCore drives it. See Note [Bucket rebuild after the first
// backward] in ddp/reducer.cpp.
TEST_CASE("ddp: buckets are rebuilt in rank 0's gradient-ready order after the first backward", "[ddp]") {
  const int rank = group().rank(), world = group().size();
  torch::manual_seed(0);
  auto net = std::make_shared<OutOfOrder>();
  std::vector<std::string> names;
  std::vector<torch::Tensor> params;
  for (const auto& item : net->named_parameters()) names.push_back(item.key()), params.push_back(item.value());
  const std::size_t n = params.size();
  // 64-byte caps: several buckets, none holding all parameters.
  cpprun::detail::Reducer reducer(names, params, group(), cpprun::DdpOptions().bucket_cap_mb(64e-6).first_bucket_cap_mb(64e-6));

  std::vector<std::size_t> reverse_registration(n);
  for (std::size_t i = 0; i < n; ++i) reverse_registration[i] = n - 1 - i;
  CHECK(flattened(reducer.bucket_parameters()) == reverse_registration);
  CHECK(reducer.bucket_count() > 1);

  std::vector<std::size_t> ready;  // this backward's order, as the reducer's own hooks see it
  std::mutex ready_mutex;
  cpprun::detail::GradientReadyHooks record;
  for (std::size_t i = 0; i < n; ++i) {
    record.add(params[i], [&, i] {
      std::lock_guard<std::mutex> lock(ready_mutex);
      ready.push_back(i);
    });
  }
  auto first_order = torch::full({static_cast<int64_t>(n)}, -1, torch::kLong);  // same size on every rank
  std::vector<std::vector<std::size_t>> rebuilt;
  for (int step = 0; step < 3; ++step) {
    reducer.check_previous_backward(/*will_reduce=*/true);
    reducer.rebuild_buckets_if_due();
    if (step == 1) {  // rebuilt from the first backward: rank 0's order, on every rank
      cpprun::broadcast(group(), first_order, 0);
      const int64_t* rank0 = first_order.data_ptr<int64_t>();
      const std::vector<std::size_t> expected(rank0, rank0 + n);
      INFO("rank " << rank << " of " << world);
      rebuilt = reducer.bucket_parameters();
      CHECK(flattened(rebuilt) == expected);
      CHECK(expected != reverse_registration);  // else this test could not tell a rebuild happened
      CHECK(rebuilt.size() > 1);
    }
    ready.clear();
    auto x = inputs_for("mlp", kGlobalBatch, step);
    auto out = net->forward(slice(x, rank, world));
    reducer.prepare_for_backward({out});
    torch::nn::functional::cross_entropy(out, slice(targets_for(kGlobalBatch, step), rank, world)).backward();
    CHECK(ready.size() == n);
    if (step == 0) {
      for (std::size_t i = 0; i < std::min(n, ready.size()); ++i) first_order[i] = static_cast<int64_t>(ready[i]);
    }
  }
  CHECK(reducer.bucket_parameters() == rebuilt);  // rebuilt once: later backwards do not re-bucket
}

// White box: Note [Nothing to reduce alone] in ddp/reducer.cpp. Alone without a comm hook the
// buckets are never used, and take no memory; a hook runs on them, and gets them.
TEST_CASE("ddp: alone without a comm hook the buckets take no memory; with one they do", "[ddp]") {
  const int world = group().size();
  auto net = std::make_shared<Mlp>();
  std::vector<std::string> names;
  std::vector<torch::Tensor> params;
  int64_t param_bytes = 0;
  for (const auto& item : net->named_parameters()) {
    names.push_back(item.key()), params.push_back(item.value());
    param_bytes += static_cast<int64_t>(item.value().nbytes());
  }
  const auto small_buckets = cpprun::DdpOptions().bucket_cap_mb(1e-3).first_bucket_cap_mb(1e-3);
  cpprun::detail::Reducer plain(names, params, group(), small_buckets);
  REQUIRE(plain.bucket_count() > 1);
  CHECK(plain.bucket_bytes() == (world == 1 ? 0 : param_bytes));
  cpprun::detail::Reducer hooked(names, params, group(), small_buckets);
  hooked.set_comm_hook(cpprun::allreduce_hook());
  CHECK(hooked.bucket_bytes() == param_bytes);
}

TEST_CASE("ddp: gradient_as_bucket_view gives the same training", "[ddp]") {
  check_parity<Mlp>("mlp", "sgd", cpprun::DdpOptions().gradient_as_bucket_view(true).bucket_cap_mb(0.002));
  check_parity<SmallCnn>("cnn", "adam", cpprun::DdpOptions().gradient_as_bucket_view(true));
}

// Without a hook the reducer scales gradients by 1/world as it copies them into the bucket; the
// hook gets them unscaled and averages after the sum. Both must train the same.
// As PyTorch's reducer: with gradient_as_bucket_view a parameter's .grad becomes its bucket's view
// as soon as it is copied in, so autograd's own gradient is freed during backward. It became the
// view only at the end of backward, every fresh gradient alive until then: a second copy of all
// the gradients at the peak (an audit, 2026-12-07).
TEST_CASE("ddp: gradient_as_bucket_view makes .grad the bucket's view during backward", "[ddp]") {
  torch::manual_seed(1);
  torch::nn::Sequential net(torch::nn::Linear(4, 8), torch::nn::Tanh(), torch::nn::Linear(8, 2));
  auto ddp = cpprun::DistributedDataParallel(net, group(), cpprun::DdpOptions().gradient_as_bucket_view(true));
  torch::optim::SGD opt(ddp->parameters(), 0.1);
  const torch::Tensor last = net->named_parameters()["2.weight"];
  const void* during = nullptr;
  // The first layer's weight gets its gradient last: by then the last layer's is in its bucket.
  net->named_parameters()["0.weight"].register_hook([&](const torch::Tensor& grad) {
    during = last.grad().defined() ? last.grad().data_ptr() : nullptr;
    return grad;
  });
  for (int step = 0; step < 3; ++step) {
    opt.zero_grad();  // to none: each backward makes fresh gradients
    ddp->forward(torch::randn({6, 4})).sum().backward();
    INFO("step " << step);
    REQUIRE(last.grad().defined());
    // Alone, nothing is reduced and .grad stays autograd's (Note [Nothing to reduce alone]).
    if (group().size() > 1) CHECK(during == last.grad().data_ptr());
    opt.step();
  }
}

TEST_CASE("ddp: allreduce_hook registered by hand trains as the built-in reduction", "[ddp]") {
  check_parity<Mlp>("mlp", "sgd", cpprun::DdpOptions(), 3, cpprun::allreduce_hook());
  check_parity<Mlp>("mlp", "sgd", cpprun::DdpOptions().gradient_as_bucket_view(true), 3, cpprun::allreduce_hook());
}

// Float64 models whose gradients cross the wire in 16 bits: the parameters stay as close to the
// float64 reference as that rounding allows. Measured at 1-4 ranks (worst parameter's relative
// difference, printed from check_same_parameters): fp16 9.2e-5, bf16 4.6e-4; the bounds are about
// twice that. This alone would pass a hook that does not compress: the next test checks the values.
TEST_CASE("ddp: fp16 and bf16 compression hooks train within their precision", "[ddp]") {
  check_parity<Mlp>("mlp", "sgd", cpprun::DdpOptions(), 3, cpprun::fp16_compress_hook(), 2e-4);
  check_parity<Mlp>("mlp", "sgd", cpprun::DdpOptions(), 3, cpprun::bf16_compress_hook(), 1e-3);
}

// What a compression hook leaves in .grad: every rank's gradient rounded to the wire type and
// divided by the world size there (as the hook does, so that the sum cannot overflow), summed in
// that type, converted back. Each rank's own gradient is computed here by the reference, slice by
// slice. Only the order of the wire-type sum is the collective's, so the check allows its
// rounding: at most (world - 1) units of 16-bit rounding of the summed magnitudes (exact at one
// rank). A hook that sends float64 fails the first check (its averages are no 16-bit values),
// one that sends the other type or forgets the division the second.
TEST_CASE("ddp: fp16 and bf16 compression hooks average the gradients rounded to 16 bits", "[ddp]") {
  Float64Parity float64;
  const int rank = group().rank(), world = group().size();
  const std::vector<std::pair<at::ScalarType, std::shared_ptr<cpprun::CommHook>>> hooks = {
      {at::kHalf, cpprun::fp16_compress_hook()}, {at::kBFloat16, cpprun::bf16_compress_hook()}};
  for (const auto& [wire, hook] : hooks) {
    INFO("wire type " << wire);
    const double unit = wire == at::kHalf ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);  // unit roundoff
    torch::manual_seed(0);
    auto net = std::make_shared<Mlp>();
    auto ddp = cpprun::DistributedDataParallel(net, group());
    ddp->register_comm_hook(hook);
    auto ref = std::make_shared<Mlp>();
    copy_state(*ref, *net);
    const auto x = inputs_for("mlp", kGlobalBatch, 0);
    const auto y = targets_for(kGlobalBatch, 0);
    torch::nn::functional::cross_entropy(ddp->forward(slice(x, rank, world)), slice(y, rank, world)).backward();

    std::map<std::string, torch::Tensor> expected, magnitude;
    for (int r = 0; r < world; ++r) {
      ref->zero_grad();
      torch::nn::functional::cross_entropy(ref->forward(slice(x, r, world)), slice(y, r, world)).backward();
      for (const auto& item : ref->named_parameters()) {
        const auto sent = item.value().grad().to(wire).div_(world).to(torch::kDouble);
        if (r == 0) expected[item.key()] = torch::zeros_like(sent), magnitude[item.key()] = torch::zeros_like(sent);
        expected[item.key()] += sent;
        magnitude[item.key()] += sent.abs();
      }
    }
    for (const auto& item : net->named_parameters()) {
      INFO("gradient of " << item.key());
      const auto grad = item.value().grad();
      CHECK(grad.equal(grad.to(wire).to(torch::kDouble)));
      const auto excess = (grad - expected[item.key()]).abs() - 1.001 * (world - 1) * unit * magnitude[item.key()];
      CHECK(excess.max().item<double>() <= 0);
    }
  }
}

// Buckets never mix dtypes. fc1 stays float32, so this case's tolerance is float32's: the ranks'
// gradients summed in another order than the reference's. Measured at 1-4 ranks (worst
// parameter's relative difference, printed from check_same_parameters): 9.4e-8; bound 1e-6.
// Both with SGD: Adam's nearly sign-like step on a gradient near zero turns such a rounding
// difference into a heavy tail (a simulation of this model over 600 seeds: worst 1.45e-6 under
// Adam, 1.0e-7 under SGD), a verdict another machine's rounding could fail (2026-12-07); and SGD
// shows a gradient's scale, which Adam's step hides.
TEST_CASE("ddp: parameters of several dtypes", "[ddp]") {
  check_parity<MixedPrecisionMlp>("mlp", "sgd", cpprun::DdpOptions(), 5, nullptr, 1e-6);
  check_parity<MixedPrecisionMlp>("mlp", "sgd", cpprun::DdpOptions().bucket_cap_mb(0.001), 5, nullptr, 1e-6);
}

// Each rank keeps its own running statistics: the reference's are those of this rank's slices
// alone (at one rank there is nothing to tell apart). Broadcasting rank 0's would fail it.
TEST_CASE("ddp: broadcast_buffers(false) keeps each rank's own BatchNorm statistics", "[ddp]") {
  check_parity<SmallCnn>("cnn", "sgd", cpprun::DdpOptions().broadcast_buffers(false));
}

// As PyTorch's require_forward_param_sync: buffers are broadcast at a forward that follows a
// reducing forward (and at the first), not at every forward. Each rank runs its own number of
// evaluation forwards under NoGradGuard (rank r: 1 + r); a broadcast at each made the extra ones
// wait for peers that never came. Under broadcast_buffers(false) construction leaves each rank's
// buffers too.
TEST_CASE("ddp: buffers sync when PyTorch syncs them: not at every evaluation forward", "[ddp]") {
  Float64Parity float64;
  const int rank = group().rank(), world = group().size();
  torch::manual_seed(0);
  auto net = std::make_shared<SmallCnn>();
  auto ddp = cpprun::DistributedDataParallel(net, group());
  torch::optim::SGD opt(ddp->parameters(), 0.05);
  const auto train_step = [&](int seed) {
    opt.zero_grad();
    torch::nn::functional::cross_entropy(ddp->forward(inputs_for("cnn", 4, seed)), targets_for(4, seed)).backward();
    opt.step();
  };
  train_step(rank);  // each rank's own statistics now
  ddp->eval();
  {
    torch::NoGradGuard no_grad;
    for (int batch = 0; batch < 1 + rank; ++batch) ddp->forward(inputs_for("cnn", 4, 50 + batch));
    // The first evaluation forward broadcast rank 0's statistics (eval does not change them).
    auto mean = net->bn1->running_mean.sum().reshape({1}).to(torch::kDouble);
    auto all = torch::empty({world}, torch::kDouble);
    cpprun::all_gather_into(group(), all, mean);
    INFO("running means after evaluation " << all);
    CHECK(all.eq(all[0]).all().item<bool>());
  }
  ddp->train();
  // The first evaluation forward took rank 0's statistics; the training forward after the
  // evaluation (whose forwards did not reduce) does not broadcast, so rank 0's remain everywhere.
  train_step(10 + rank);
  {
    torch::NoGradGuard no_grad;
    auto mean = net->bn1->running_mean.sum().reshape({1});
    auto all = torch::empty({world}, torch::kDouble);
    cpprun::all_gather_into(group(), all, mean);
    INFO("running means " << all);
    if (world > 1) CHECK_FALSE(all.eq(all[0]).all().item<bool>());  // each rank's own step since
  }
  train_step(20 + rank);  // follows a reducing forward: broadcasts rank 0's, then each updates its own
  cpprun::barrier(group());

  // broadcast_buffers(false): nothing of the buffers at construction either.
  auto own = std::make_shared<SmallCnn>();
  {
    torch::NoGradGuard no_grad;
    own->bn1->running_mean.fill_(rank);
  }
  auto kept = cpprun::DistributedDataParallel(own, group(), cpprun::DdpOptions().broadcast_buffers(false));
  CHECK(own->bn1->running_mean.eq(rank).all().item<bool>());

  // forward_sync_buffers(false), PyTorch 2.13's name: rank 0's buffers at construction, as its init
  // sync, and none before a forward (the first forward would otherwise take rank 0's again).
  auto once = std::make_shared<SmallCnn>();
  {
    torch::NoGradGuard no_grad;
    once->bn1->running_mean.fill_(rank);
  }
  auto synced_once = cpprun::DistributedDataParallel(once, group(), cpprun::DdpOptions().forward_sync_buffers(false));
  CHECK(once->bn1->running_mean.eq(0).all().item<bool>());
  {
    torch::NoGradGuard no_grad;
    once->bn1->running_mean.fill_(rank);
    synced_once->eval();
    synced_once->forward(inputs_for("cnn", 4, 70));
  }
  CHECK(once->bn1->running_mean.eq(rank).all().item<bool>());
  // Given both, forward_sync_buffers wins, as PyTorch's.
  const auto both = cpprun::DdpOptions().broadcast_buffers(false).forward_sync_buffers(true);
  CHECK((both.syncs_buffers_before_forward() && both.syncs_buffers_at_construction()));
  // Read back, either name gives the sync in effect, as PyTorch 2.15's properties.
  const auto off = cpprun::DdpOptions().forward_sync_buffers(false);
  CHECK_FALSE((off.broadcast_buffers() || off.forward_sync_buffers()));
  CHECK((cpprun::DdpOptions().broadcast_buffers() && cpprun::DdpOptions().forward_sync_buffers()));
}

// Without init_sync nothing is broadcast at construction: equal starting weights are the
// caller's business.
TEST_CASE("ddp: init_sync(false) keeps each rank's own initial parameters and buffers", "[ddp]") {
  Float64Parity float64;
  const int rank = group().rank(), world = group().size();
  torch::manual_seed(100 + rank);
  auto net = std::make_shared<SmallCnn>();
  {
    torch::NoGradGuard no_grad;
    net->bn1->running_mean.fill_(rank);
  }
  auto initial = std::make_shared<SmallCnn>();
  copy_state(*initial, *net);
  auto ddp = cpprun::DistributedDataParallel(net, group(), cpprun::DdpOptions().init_sync(false));
  check_same_parameters(*net, *initial, 0);
  CHECK(net->bn1->running_mean.equal(initial->bn1->running_mean));
  if (world > 1) {  // else this test could not tell a broadcast happened
    auto first = net->conv1->weight.detach().flatten()[0].reshape({1});
    auto all = torch::empty({world}, torch::kDouble);
    cpprun::all_gather_into(group(), all, first);
    CHECK_FALSE(all.eq(all[0]).all().item<bool>());
  }
}

TEST_CASE("ddp: no_sync accumulates locally, the next backward reduces the sum", "[ddp]") {
  Float64Parity float64;
  const int rank = group().rank(), world = group().size();
  const bool bucket_view = GENERATE(false, true);  // .grad its own tensor, or the bucket's slot
  INFO("gradient_as_bucket_view " << bucket_view);
  torch::manual_seed(0);
  auto net = std::make_shared<Mlp>();
  auto ddp = cpprun::DistributedDataParallel(net, group(), cpprun::DdpOptions().gradient_as_bucket_view(bucket_view));
  auto ref = std::make_shared<Mlp>();
  copy_state(*ref, *net);
  torch::optim::SGD opt(ddp->parameters(), 0.1), ref_opt(ref->parameters(), 0.1);

  for (int step = 0; step < 3; ++step) {  // the third runs on the buckets rebuilt in the second
    opt.zero_grad();
    ref_opt.zero_grad();
    for (int micro = 0; micro < 3; ++micro) {  // two micro-batches without sync, then one with
      auto x = inputs_for("mlp", kGlobalBatch, 10 * step + micro);
      auto y = targets_for(kGlobalBatch, 10 * step + micro);
      auto local_loss = [&] {
        return torch::nn::functional::cross_entropy(ddp->forward(slice(x, rank, world)), slice(y, rank, world));
      };
      if (micro < 2) {
        auto guard = ddp->no_sync();
        local_loss().backward();
        if (world > 1 && micro == 0 && step == 0) {  // unsynchronized: ranks' gradients still differ
          auto grad = net->fc1->weight.grad().sum().reshape({1}).to(torch::kDouble);
          auto all = torch::empty({world}, torch::kDouble);
          cpprun::all_gather_into(group(), all, grad);
          CHECK_FALSE(all.eq(all[0]).all().item<bool>());
        }
      } else {
        local_loss().backward();
      }
      reference_backward(*ref, x, y, world);
    }
    opt.step();
    ref_opt.step();
  }
  check_same_parameters(*net, *ref, kParityTolerance);
}

// Note [A forward that reduces nothing leaves the reducer alone] in ddp/reducer.cpp: a forward
// under no grad or no_sync between a training forward and its backward (a metric, a teacher's
// output) once made that backward reduce nothing, each rank keeping its own gradient.
TEST_CASE("ddp: a forward under no grad or no_sync before the backward leaves its averaging alone", "[ddp]") {
  Float64Parity float64;
  const int rank = group().rank(), world = group().size();
  for (const std::string between : {"no grad", "no_sync"}) {
    INFO("a forward under " << between << " between the training forward and its backward");
    torch::manual_seed(0);
    auto net = std::make_shared<Mlp>();
    auto ddp = cpprun::DistributedDataParallel(net, group());
    auto ref = std::make_shared<Mlp>();
    copy_state(*ref, *net);
    torch::optim::SGD opt(ddp->parameters(), 0.1), ref_opt(ref->parameters(), 0.1);
    for (int step = 0; step < 3; ++step) {
      auto x = inputs_for("mlp", kGlobalBatch, step);
      auto y = targets_for(kGlobalBatch, step);
      opt.zero_grad();
      auto loss = torch::nn::functional::cross_entropy(ddp->forward(slice(x, rank, world)), slice(y, rank, world));
      if (between == "no grad") {
        torch::NoGradGuard no_grad;
        ddp->forward(slice(x, world - 1 - rank, world));
      } else {
        auto guard = ddp->no_sync();
        ddp->forward(slice(x, world - 1 - rank, world));
      }
      loss.backward();
      opt.step();
      ref_opt.zero_grad();
      reference_backward(*ref, x, y, world);
      ref_opt.step();
    }
    check_same_parameters(*net, *ref, kParityTolerance);
  }
}

// Under create_graph the gradients require grad themselves; the reducer must still average their
// values (and not refuse them: out= ops reject tensors that require grad in grad mode).
TEST_CASE("ddp: backward(create_graph=true) still averages the gradients", "[ddp]") {
  Float64Parity float64;
  const int rank = group().rank(), world = group().size();
  torch::manual_seed(0);
  auto net = std::make_shared<Mlp>();
  auto ddp = cpprun::DistributedDataParallel(net, group());
  auto ref = std::make_shared<Mlp>();
  copy_state(*ref, *net);
  auto x = inputs_for("mlp", kGlobalBatch, 0);
  auto y = targets_for(kGlobalBatch, 0);
  auto loss = torch::nn::functional::cross_entropy(ddp->forward(slice(x, rank, world)), slice(y, rank, world));
  loss.backward({}, /*retain_graph=*/true, /*create_graph=*/true);
  reference_backward(*ref, x, y, world);
  auto ref_params = ref->named_parameters();
  for (const auto& item : net->named_parameters()) {
    INFO("gradient of " << item.key());
    CHECK(relative_difference(item.value().grad().detach(), ref_params[item.key()].grad()) <= kParityTolerance);
  }
}

TEST_CASE("ddp: a parameter without gradient fails the next forward, naming it", "[ddp]") {
  const int rank = group().rank(), world = group().size();
  torch::manual_seed(0);
  auto ddp = cpprun::DistributedDataParallel(std::make_shared<Branchy>(), group());
  auto x = slice(inputs_for("mlp", kGlobalBatch, 0), rank, world);
  auto y = slice(targets_for(kGlobalBatch, 0), rank, world);
  torch::nn::functional::cross_entropy(ddp->forward(x, true), y).backward();
  CHECK_THROWS_WITH(ddp->forward(x, true),
                    Catch::Contains("find_unused_parameters(true)") && Catch::Contains("unused.weight") &&
                        Catch::Contains("unused.bias") && Catch::Contains("rank " + std::to_string(rank)));
  cpprun::barrier(group());
}

// Branchy's reference gradients for the whole global batch: each rank's slice through the branch
// where `uses_branch(rank)` says, its loss over the world.
void branchy_reference_backward(Branchy& ref, const torch::Tensor& x, const torch::Tensor& y, int world,
                                const std::function<bool(int)>& uses_branch) {
  for (int r = 0; r < world; ++r) {
    auto loss =
        torch::nn::functional::cross_entropy(ref.forward(slice(x, r, world), uses_branch(r)), slice(y, r, world));
    (loss / world).backward();
  }
}

// A Branchy in DDP with find_unused_parameters, and its one-process twin, each with SGD at 0.1.
struct UnusedBranchParity {
  explicit UnusedBranchParity(bool bucket_view)
      : net((torch::manual_seed(0), std::make_shared<Branchy>())),
        ddp(net, group(), cpprun::DdpOptions().find_unused_parameters(true).gradient_as_bucket_view(bucket_view)),
        ref(std::make_shared<Branchy>()),
        opt(ddp->parameters(), 0.1),
        ref_opt(ref->parameters(), 0.1) {
    copy_state(*ref, *net);
  }
  // This rank's loss on its slice, through the branch if `uses_branch`.
  torch::Tensor loss(const torch::Tensor& x, const torch::Tensor& y, bool uses_branch) {
    const int rank = group().rank(), world = group().size();
    return torch::nn::functional::cross_entropy(ddp->forward(slice(x, rank, world), uses_branch),
                                                slice(y, rank, world));
  }
  std::shared_ptr<Branchy> net;
  cpprun::DistributedDataParallel<Branchy> ddp;
  std::shared_ptr<Branchy> ref;
  torch::optim::SGD opt, ref_opt;
};

TEST_CASE("ddp: find_unused_parameters: partly used parameters average, never-used keep .grad", "[ddp]") {
  Float64Parity float64;
  for (bool static_graph : {false, true}) {
    const int rank = group().rank(), world = group().size();
    torch::manual_seed(0);
    auto net = std::make_shared<Branchy>();
    auto options = static_graph ? cpprun::DdpOptions().static_graph(true) : cpprun::DdpOptions().find_unused_parameters(true);
    auto ddp = cpprun::DistributedDataParallel(net, group(), options);
    auto ref = std::make_shared<Branchy>();
    copy_state(*ref, *net);
    torch::optim::SGD opt(ddp->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    torch::optim::SGD ref_opt(ref->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    const bool branch_here = rank % 2 == 0;  // odd ranks skip the branch
    for (int step = 0; step < 4; ++step) {
      auto x = inputs_for("mlp", kGlobalBatch, step);
      auto y = targets_for(kGlobalBatch, step);
      opt.zero_grad();
      torch::nn::functional::cross_entropy(ddp->forward(slice(x, rank, world), branch_here), slice(y, rank, world))
          .backward();
      INFO("static_graph " << static_graph << " step " << step);
      CHECK_FALSE(net->unused->weight.grad().defined());  // no rank used it: untouched
      CHECK(net->branch->weight.grad().defined());        // rank 0 used it: every rank has the average
      opt.step();
      ref_opt.zero_grad();
      branchy_reference_backward(*ref, x, y, world, [](int r) { return r % 2 == 0; });
      ref_opt.step();
    }
    check_same_parameters(*net, *ref, kParityTolerance);
  }
}

TEST_CASE("ddp: find_unused_parameters: a .grad accumulated under no_sync goes into the average unused", "[ddp]") {
  // Every rank uses the branch in two no_sync backwards; odd ranks skip it in the synced one. They
  // still send what they accumulated, as PyTorch's reducer does (cpprun once sent zeros for it).
  Float64Parity float64;
  const bool bucket_view = GENERATE(false, true);
  INFO("gradient_as_bucket_view " << bucket_view);
  UnusedBranchParity t(bucket_view);
  for (int step = 0; step < 3; ++step) {
    t.opt.zero_grad();
    t.ref_opt.zero_grad();
    for (int micro = 0; micro < 3; ++micro) {
      auto x = inputs_for("mlp", kGlobalBatch, 10 * step + micro);
      auto y = targets_for(kGlobalBatch, 10 * step + micro);
      const auto branch_for = [&](int r) { return micro < 2 || r % 2 == 0; };
      {
        std::optional<cpprun::NoSyncGuard> guard;
        if (micro < 2) guard.emplace(t.ddp->no_sync());
        t.loss(x, y, branch_for(group().rank())).backward();
      }
      branchy_reference_backward(*t.ref, x, y, group().size(), branch_for);
    }
    INFO("step " << step);
    CHECK_FALSE(t.net->unused->weight.grad().defined());
    t.opt.step();
    t.ref_opt.step();
  }
  check_same_parameters(*t.net, *t.ref, kParityTolerance);
}

TEST_CASE("ddp: find_unused_parameters: a zero_grad between forward and backward clears what goes in", "[ddp]") {
  // Note [Unused parameters join at the backward's start]: odd ranks use the branch in step 0 and
  // skip it after; the loop zeroes the gradients after the forward (PyTorch's ImageNet example's
  // order). Marked at the forward, the branch sent step 0's average again in each later step.
  Float64Parity float64;
  const bool bucket_view = GENERATE(false, true);
  INFO("gradient_as_bucket_view " << bucket_view);
  UnusedBranchParity t(bucket_view);
  for (int step = 0; step < 3; ++step) {
    auto x = inputs_for("mlp", kGlobalBatch, step);
    auto y = targets_for(kGlobalBatch, step);
    const auto branch_for = [&](int r) { return step == 0 || r % 2 == 0; };
    auto loss = t.loss(x, y, branch_for(group().rank()));
    t.opt.zero_grad();
    loss.backward();
    t.opt.step();
    t.ref_opt.zero_grad();
    branchy_reference_backward(*t.ref, x, y, group().size(), branch_for);
    t.ref_opt.step();
  }
  check_same_parameters(*t.net, *t.ref, kParityTolerance);
}

TEST_CASE("ddp: models that differ between ranks are refused, naming rank and parameter", "[ddp]") {
  const int rank = group().rank(), world = group().size();
  if (world == 1) return;
  auto net = std::make_shared<Mlp>(rank == world - 1 ? 33 : 32);
  const std::string last = std::to_string(world - 1);
  CHECK_THROWS_WITH(cpprun::DistributedDataParallel(net, group()),
                    Catch::Contains("fc1.weight") && Catch::Contains("[33, 10]") && Catch::Contains("rank " + last) &&
                        Catch::Contains("[32, 10]"));
  // The same model, frozen otherwise on the last rank: parameter 0 is another one there, and the
  // name given is this rank's own, said as such (it was put beside the other rank's shape).
  auto frozen = std::make_shared<Mlp>();
  frozen->named_parameters()[rank == world - 1 ? "fc1.bias" : "fc1.weight"].requires_grad_(false);
  CHECK_THROWS_WITH(cpprun::DistributedDataParallel(frozen, group()),
                    Catch::Contains("the ranks' parameters that require grad differ at parameter 0") &&
                        Catch::Contains("(on this rank, rank " + std::to_string(rank) + ", it is \"" +
                                        (rank == world - 1 ? "fc1.weight" : "fc1.bias") + "\")"));
}

TEST_CASE("ddp: a module converted after wrapping is refused at its next forward", "[ddp]") {
  // Note [A module converted after wrapping]: the gradient hooks are gone, and each rank trained
  // on its own gradients without an error (as PyTorch's DDP does).
  const int rank = group().rank(), world = group().size();
  auto net = std::make_shared<Mlp>();
  auto ddp = cpprun::DistributedDataParallel(net, group());
  net->to(at::kDouble);
  const auto x = slice(inputs_for("mlp", kGlobalBatch, 0), rank, world).to(at::kDouble);
  CHECK_THROWS_WITH(ddp->forward(x), Catch::Contains("\"fc1.weight\" is Double on cpu but was Float on cpu") &&
                                         Catch::Contains("Call to() before wrapping it"));
  // An evaluation computes as the converted module does (as PyTorch's DDP).
  torch::NoGradGuard no_grad;
  CHECK(ddp->forward(x).equal(net->forward(x)));
}

TEST_CASE("ddp: a module loaded by torch::load after wrapping is refused at its next forward", "[ddp]") {
  // torch::load(module, file) writes each parameter by Tensor::set_, which gives it a new gradient
  // accumulator with none of DDP's hooks: the ranks trained apart without a word.
  const int rank = group().rank(), world = group().size();
  const std::string name = "cpprun_ddp_torch_load_" + std::to_string(::getppid()) + "_" + std::to_string(rank);
  const std::string file = (std::filesystem::temp_directory_path() / (name + ".pt")).string();
  auto saved = std::make_shared<Mlp>();
  torch::save(saved, file);
  auto net = std::make_shared<Mlp>();
  auto ddp = cpprun::DistributedDataParallel(net, group());
  torch::load(net, file);
  const auto x = slice(inputs_for("mlp", kGlobalBatch, 0), rank, world);
  CHECK_THROWS_WITH(ddp->forward(x), Catch::Contains("the parameter \"fc1.weight\" was replaced after wrapping") &&
                                         Catch::Contains("Load before wrapping"));
  // Loaded before wrapping, it trains as one process would.
  auto loaded = std::make_shared<Mlp>();
  torch::load(loaded, file);
  auto ddp_loaded = cpprun::DistributedDataParallel(loaded, group());
  torch::nn::functional::cross_entropy(ddp_loaded->forward(x), slice(targets_for(kGlobalBatch, 0), rank, world))
      .backward();
  std::filesystem::remove(file);
}

TEST_CASE("ddp: uneven inputs under join: ranks that run out shadow the others", "[ddp]") {
  Float64Parity float64;
  const int rank = group().rank(), world = group().size();
  torch::manual_seed(0);
  auto net = std::make_shared<SmallCnn>();
  auto ddp = cpprun::DistributedDataParallel(net, group());
  auto ref = std::make_shared<SmallCnn>();
  copy_state(*ref, *net);
  torch::optim::SGD opt(ddp->parameters(), 0.05), ref_opt(ref->parameters(), 0.05);
  auto batches_of = [](int r) { return 2 + r; };  // rank r has 2 + r batches
  constexpr int64_t kPerRank = 4;

  ddp->join([&] {
    for (int step = 0; step < batches_of(rank); ++step) {
      auto x = inputs_for("cnn", kPerRank, 100 * rank + step);
      auto y = targets_for(kPerRank, 100 * rank + step);
      opt.zero_grad();
      torch::nn::functional::cross_entropy(ddp->forward(x), y).backward();
      opt.step();
    }
  });
  // Reference: at each step, the ranks that still have batches contribute; the sum is divided by
  // the whole world size (PyTorch's default under Join).
  for (int step = 0; step < batches_of(world - 1); ++step) {
    ref_opt.zero_grad();
    for (int r = world - 1; r >= 0; --r) {
      if (step >= batches_of(r)) continue;
      auto x = inputs_for("cnn", kPerRank, 100 * r + step);
      auto y = targets_for(kPerRank, 100 * r + step);
      (torch::nn::functional::cross_entropy(ref->forward(x), y) / world).backward();
    }
    ref_opt.step();
  }
  // The last rank ran every step; at join's end every rank takes its parameters (PyTorch's
  // _sync_final_model), so all match the reference.
  check_same_parameters(*net, *ref, kParityTolerance);
  cpprun::barrier(group());
}

// PowerSGD under join, over several buckets: a joined rank runs every bucket's hook on zeros and
// must issue the hook's collectives in the active ranks' order (all buckets' uncompressed and P
// all-reduces, then each bucket's Q all-reduce: Note [PowerSGD's chain of work]), as PyTorch's
// _match_all_reduce_for_bwd_pass runs every bucket's hook before waiting on any. Waited bucket
// by bucket, the joined rank's Q of bucket 0 met the active ranks' next bucket. The joined rank
// sends zeros, so a mismatch of equal sizes would go unseen: the layers' widths and rank 2 make
// each bucket's Q another size than the next bucket's uncompressed biases, and the check before
// each all-reduce (Note [Collective consistency check]) refuses the mismatch. Against a run
// without join in which a rank that has run out backpropagates a zero loss.
TEST_CASE("ddp: PowerSGD under join: a joined rank's buckets meet the active ranks' collectives", "[ddp]") {
  Float64Parity float64;
  const int rank = group().rank(), world = group().size();
  const auto powersgd = cpprun::PowerSGDOptions().matrix_approximation_rank(2).start_powerSGD_iter(1)
                            .use_error_feedback(false).warm_start(false);
  // 2 KiB buckets: one Linear each (8x16, 16x24 and 24x10 float64 weights with their biases).
  const auto buckets = cpprun::DdpOptions().bucket_cap_mb(0.002).first_bucket_cap_mb(0.001);
  auto make = [] {
    return torch::nn::Sequential(torch::nn::Linear(10, 24), torch::nn::ReLU(), torch::nn::Linear(24, 16),
                                 torch::nn::ReLU(), torch::nn::Linear(16, 8));
  };
  auto batches_of = [](int r) { return 2 + r; };  // rank r has 2 + r batches: PowerSGD from its second
  constexpr int64_t kPerRank = 4;
  auto batch = [&](int r, int step) {
    return std::make_pair(inputs_for("mlp", kPerRank, 100 * r + step), targets_for(kPerRank, 100 * r + step));
  };
  torch::manual_seed(0);
  auto net = make();
  auto ref = make();
  copy_state(*ref.ptr(), *net.ptr());

  auto ddp = cpprun::DistributedDataParallel(net.ptr(), group(), buckets);
  ddp->register_comm_hook(cpprun::powerSGD_hook(powersgd));
  torch::optim::SGD opt(ddp->parameters(), 0.05);
  ddp->join([&] {
    for (int step = 0; step < batches_of(rank); ++step) {
      const auto [x, y] = batch(rank, step);
      opt.zero_grad();
      torch::nn::functional::cross_entropy(ddp->forward(x), y).backward();
      opt.step();
    }
  });

  auto ref_ddp = cpprun::DistributedDataParallel(ref.ptr(), group(), buckets);
  ref_ddp->register_comm_hook(cpprun::powerSGD_hook(powersgd));
  torch::optim::SGD ref_opt(ref_ddp->parameters(), 0.05);
  for (int step = 0; step < batches_of(world - 1); ++step) {
    const bool out = step >= batches_of(rank);  // joined by now: its gradients are zeros
    const auto [x, y] = batch(rank, out ? 0 : step);
    ref_opt.zero_grad();
    (torch::nn::functional::cross_entropy(ref_ddp->forward(x), y) * (out ? 0.0 : 1.0)).backward();
    ref_opt.step();
  }
  check_same_parameters(*net.ptr(), *ref.ptr(), kParityTolerance);
  cpprun::barrier(group());
}

// noop_hook: every rank keeps its own gradient (what PyTorch's debugging hook is for: the bound
// on what communication costs); powerSGD_hook's arguments it cannot run are refused by name
// (start_powerSGD_iter as PyTorch's; a rank below 1, which PyTorch takes and fails on later).
// PowerSGD's training against PyTorch's is dist.powersgd_parity.
TEST_CASE("ddp: the noop hook leaves each rank's gradient; PowerSGD refuses arguments it cannot run", "[ddp]") {
  Float64Parity float64;
  const int rank = group().rank(), world = group().size();
  torch::manual_seed(0);
  auto net = std::make_shared<Mlp>();
  auto ddp = cpprun::DistributedDataParallel(net, group());
  ddp->register_comm_hook(cpprun::noop_hook());
  auto ref = std::make_shared<Mlp>();
  copy_state(*ref, *net);
  const auto x = inputs_for("mlp", kGlobalBatch, 0);
  const auto y = targets_for(kGlobalBatch, 0);
  torch::nn::functional::cross_entropy(ddp->forward(slice(x, rank, world)), slice(y, rank, world)).backward();
  torch::nn::functional::cross_entropy(ref->forward(slice(x, rank, world)), slice(y, rank, world)).backward();
  auto mine = ref->named_parameters();
  for (const auto& item : net->named_parameters()) CHECK(item.value().grad().equal(mine[item.key()].grad()));

  CHECK_THROWS_WITH(cpprun::powerSGD_hook(cpprun::PowerSGDOptions().start_powerSGD_iter(1)),
                    Catch::Contains("start_powerSGD_iter must be above 1"));
  CHECK_NOTHROW(cpprun::powerSGD_hook(cpprun::PowerSGDOptions().start_powerSGD_iter(1).use_error_feedback(false)
                                          .warm_start(false)));
  CHECK_THROWS_WITH(cpprun::powerSGD_hook(cpprun::PowerSGDOptions().matrix_approximation_rank(0)),
                    Catch::Contains("matrix_approximation_rank must be at least 1"));
}

// PowerSGD's hook returns as soon as its bucket's first all-reduces are issued, as PyTorch's
// returns a chain of futures (Note [PowerSGD's chain of work]): rank 0 comes back from run()
// while the other ranks have not yet joined the all-reduce; the rest runs when the work is
// waited for, and leaves every rank with the same average. (The blocking hook it replaced waited
// there for the slowest rank.) Timed only as dist.powersgd_overlap runs it, with
// CPPRUN_CHECK_COLLECTIVES=0: by default each Gloo all-reduce's issue waits for every rank to
// reach it (Note [Collective consistency check]), the hook's as DDP's own. Its numbers against
// PyTorch's: dist.powersgd_parity.
TEST_CASE("ddp: PowerSGD's hook does not wait for its bucket's communication", "[ddp]") {
  const int rank = group().rank(), world = group().size();
  const char* checks = std::getenv("CPPRUN_CHECK_COLLECTIVES");
  const bool unchecked = checks != nullptr && std::string(checks) == "0";
  auto hook = cpprun::powerSGD_hook(cpprun::PowerSGDOptions().start_powerSGD_iter(2));
  cpprun::GradBucket bucket;
  bucket.is_last = true;
  bucket.parameters = {torch::zeros({16, 16}, torch::kDouble), torch::zeros({16}, torch::kDouble)};
  bucket.buffer = torch::empty({16 * 16 + 16}, torch::kDouble);
  torch::manual_seed(rank);
  for (int step = 0; step < 3; ++step) {  // two plain all-reduces, then PowerSGD (the weight as P and Q)
    bucket.buffer.copy_(torch::randn({16 * 16 + 16}, torch::kDouble));
    const bool timed = step == 2 && world > 1 && unchecked;
    cpprun::barrier(group());
    if (timed && rank != 0) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    const auto start = std::chrono::steady_clock::now();
    cpprun::Work work = hook->run(group(), bucket);
    const auto returned = std::chrono::steady_clock::now() - start;
    if (timed && rank == 0) CHECK(returned < std::chrono::milliseconds(500));
    work.wait();
  }
  auto rank0 = bucket.buffer.clone();
  cpprun::broadcast(group(), rank0, 0);
  CHECK(rank0.equal(bucket.buffer));
}
