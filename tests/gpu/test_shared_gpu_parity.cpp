// Every rank on one device, over Gloo: the ranks of `cpprun --nproc_per_node=N` share
// CPPRUN_TEST_DEVICE (cpu, or cuda:K: one GPU, which NCCL would refuse to share), and each trains
// on its slice of every global batch beside a reference trained in one process on the whole batch,
// on the same device; parameters must match. On cuda:0 this runs DDP's and FSDP's CUDA paths
// (the ring collectives' host staging, on the default stream and on one of the caller's own,
// pinned offload, autocast, GradScaler) with several ranks on a
// one-GPU machine (tests/gpu/shared_parity.sh skips elsewhere); on cpu the same test logic runs in
// CI. In float64 with the CPU suite's tolerance (Note [Parity in float64] in parity_checks.h): on
// CUDA too the ranks' and the reference's forwards and backwards run the same kernels on the same
// shapes (the reference goes slice by slice), so only the order of summing the ranks' gradients
// differs, as on the CPU. The fp16 autocast case stays float32 (autocast casts float32 only) at
// kFp16Tolerance. Both bounds held on an H200 (docs/gpu_run.md, gpu.shared_parity.np2/np4).
#include "catch.h"
#include <torch/torch.h>
#include <unistd.h>  // getppid

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>

#include <ATen/autocast_mode.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include "cpprun/cpprun.h"
#include "ddp_test_models.h"
#include "dist_test_support.h"
#include "parity_checks.h"
#include "parity_training.h"

using namespace ddp_test;

namespace {

using dist_test::slice;

constexpr int64_t kGlobalBatch = 24;
// fp16 autocast on both sides, the same kernels on the same shapes: only the float32 sum of the
// ranks' gradients differs in order. 1e-5 as the float32 suite had, with SGD (AdamW's division by
// sqrt(v) + eps magnifies rounding where a gradient is ~0). Not measured: no GPU run yet.
constexpr double kFp16Tolerance = 1e-5;

// Gloo, not kAuto: kAuto would pick NCCL for CUDA tensors, and NCCL refuses two ranks on one GPU.
const cpprun::ProcessGroup& group() {
  static const cpprun::ProcessGroup pg = [] {
    cpprun::ProcessGroupOptions options;
    options.timeout = std::chrono::seconds(60);
    options.backend = cpprun::Backend::kGloo;
    return cpprun::init_process_group(options);
  }();
  return pg;
}

torch::Device test_device() {
  static const torch::Device device = [] {
    const char* env = std::getenv("CPPRUN_TEST_DEVICE");
    const std::string name = env != nullptr ? env : "cpu";
    TORCH_CHECK(name == "cpu" || name.rfind("cuda:", 0) == 0, "CPPRUN_TEST_DEVICE=", name,
                ": expected cpu or cuda:N, the one device every rank uses");
    const torch::Device d(name);
    TORCH_CHECK(!d.is_cuda() || (torch::cuda::is_available() && d.index() < torch::cuda::device_count()),
                "CPPRUN_TEST_DEVICE=", name, ": no such GPU here (", torch::cuda::device_count(),
                " visible); tests/gpu/shared_parity.sh skips such machines");
    return d;
  }();
  return device;
}

// Mlp with its middle layer under activation checkpointing (recomputed in backward), or not.
struct CheckpointedMlp : Mlp {
  bool checkpointed = true;
  torch::Tensor forward(torch::Tensor x) {
    auto h = torch::relu(fc1(x));
    auto middle = [this](const at::Tensor& in) { return torch::relu(fc2(in)); };
    return fc3(checkpointed ? cpprun::checkpoint(middle, h) : middle(h));
  }
};

// The forward under fp16 autocast where asked (matmuls in fp16; parameters and optimizer in fp32).
template <typename Forward>
torch::Tensor maybe_autocast(bool fp16, const Forward& forward) {
  if (!fp16) return forward();
  const auto type = test_device().type();
  at::autocast::set_autocast_dtype(type, at::kHalf);
  at::autocast::set_autocast_enabled(type, true);
  auto out = forward();
  at::autocast::set_autocast_enabled(type, false);
  at::autocast::clear_cache();
  return out.to(torch::kFloat);
}

struct Run {
  std::string optimizer = "adamw";
  bool fp16 = false;  // autocast fp16 with a GradScaler on both sides
  int steps = 5;
};

// wrap(net) -> the wrapped model (DDP or FSDP). Net's weights differ per rank before wrapping:
// the wrapper must start every rank from rank 0's.
template <typename Net, typename Wrap>
void check_parity(const Wrap& wrap, const Run& run) {
  std::optional<Float64Parity> float64;
  if (!run.fp16) float64.emplace();
  const int rank = group().rank(), world = group().size();
  const auto device = test_device();
  torch::manual_seed(100 + rank);
  auto net = std::make_shared<Net>();
  net->to(device);
  auto model = wrap(net);
  auto ref = std::make_shared<Net>();
  ref->to(device);
  copy_state(*ref, *net);
  if constexpr (requires { ref->checkpointed; }) ref->checkpointed = false;  // the reference keeps activations
  auto opt = make_optimizer(run.optimizer, model->parameters());
  auto ref_opt = make_optimizer(run.optimizer, ref->parameters());
  // Scale 2^10: fp16 overflows nothing here, so no step is skipped and both sides take every one.
  const auto scaler_options = cpprun::GradScalerOptions().init_scale(1024).enabled(run.fp16);
  cpprun::GradScaler scaler(group(), scaler_options), ref_scaler(scaler_options);
  for (int step = 0; step < run.steps; ++step) {
    const auto x = inputs_for("mlp", kGlobalBatch, step).to(device);
    const auto y = targets_for(kGlobalBatch, step).to(device);
    opt->zero_grad();
    auto logits = maybe_autocast(run.fp16, [&] { return model->forward(slice(x, rank, world)); });
    CHECK(logits.device() == device);  // computed on the device, whatever holds the shards
    scaler.scale(torch::nn::functional::cross_entropy(logits, slice(y, rank, world))).backward();
    CHECK(scaler.step(*opt));
    scaler.update();
    ref_opt->zero_grad();
    reference_backward([&](torch::Tensor in) { return maybe_autocast(run.fp16, [&] { return ref->forward(in); }); },
                       x, y, world, [&](torch::Tensor loss) { return ref_scaler.scale(loss); });
    CHECK(ref_scaler.step(*ref_opt));
    ref_scaler.update();
  }
  if constexpr (requires { model->gather_full_parameters(); }) model->gather_full_parameters();
  INFO("device " << device << ", " << world << " ranks, optimizer " << run.optimizer << (run.fp16 ? ", fp16" : ""));
  CHECK(scaler.get_scale() == ref_scaler.get_scale());
  check_same_parameters(*net, *ref, run.fp16 ? kFp16Tolerance : kParityTolerance);
}

cpprun::FsdpOptions per_linear(int stage) { return cpprun::FsdpOptions().stage(stage).wrap_policy(is_linear); }

auto ddp() {
  return [](auto net) { return cpprun::DistributedDataParallel(net, group()); };
}
auto fsdp(const cpprun::FsdpOptions& options) {
  return [options](auto net) { return cpprun::FullyShardedDataParallel(net, group(), options); };
}

}  // namespace

TEST_CASE("shared_gpu: DDP matches one process, SGD-momentum and AdamW", "[shared_gpu]") {
  check_parity<Mlp>(ddp(), {.optimizer = "sgd"});
  check_parity<Mlp>(ddp(), {.optimizer = "adamw"});
}

TEST_CASE("shared_gpu: ZeRO-1, -2 and -3 match one process", "[shared_gpu]") {
  for (int stage : {1, 2, 3}) {
    INFO("stage " << stage);
    check_parity<Mlp>(fsdp(per_linear(stage)), {.optimizer = "sgd"});
    check_parity<Mlp>(fsdp(per_linear(stage)), {.optimizer = "adamw"});
  }
}

TEST_CASE("shared_gpu: HSDP over a 2x2 mesh matches one process (4 ranks)", "[shared_gpu]") {
  if (group().size() != 4) return;  // the mesh needs 2 replicas x 2 shards
  static const cpprun::DeviceMesh mesh(group(), {2, 2}, {"replicate", "shard"});
  for (int stage : {1, 2, 3}) {
    INFO("HSDP stage " << stage);
    check_parity<Mlp>([stage](auto net) { return cpprun::FullyShardedDataParallel(net, mesh, per_linear(stage)); }, {});
  }
}

TEST_CASE("shared_gpu: activation checkpointing under DDP and ZeRO-3 matches one process without it", "[shared_gpu]") {
  check_parity<CheckpointedMlp>(ddp(), {});
  check_parity<CheckpointedMlp>(fsdp(per_linear(3)), {});
}

TEST_CASE("shared_gpu: fp16 autocast with GradScaler under DDP and ZeRO-2 matches one process", "[shared_gpu]") {
  if (!test_device().is_cuda()) {
    WARN("fp16 autocast is a CUDA case: skipped on " << test_device());
    return;
  }
  check_parity<Mlp>(ddp(), {.optimizer = "sgd", .fp16 = true});
  check_parity<Mlp>(fsdp(per_linear(2)), {.optimizer = "sgd", .fp16 = true});
}

TEST_CASE("shared_gpu: ranks computing on a stream of their own (not the default) match one process",
          "[shared_gpu]") {
  // The ring collectives (ZeRO's gathers and reduce-scatters over Gloo) stage CUDA tensors through
  // host memory on the stream the caller issued them from: this is the case where that stream is
  // not the default one, so a ring that copied on another stream would race the caller's kernels.
  if (!test_device().is_cuda()) {
    WARN("a CUDA stream case: skipped on " << test_device());
    return;
  }
  const c10::impl::VirtualGuardImpl cuda(c10::DeviceType::CUDA);
  const c10::StreamGuard on_side_stream(cuda.getStreamFromGlobalPool(test_device()));
  REQUIRE(cuda.getStream(test_device()) != cuda.getDefaultStream(test_device()));
  check_parity<Mlp>(ddp(), {.optimizer = "adamw"});
  for (int stage : {2, 3}) {
    INFO("stage " << stage);
    check_parity<Mlp>(fsdp(per_linear(stage)), {.optimizer = "adamw"});
  }
}

TEST_CASE("shared_gpu: CPU offload (shards and optimizer on the host, compute on the device) matches one process",
          "[shared_gpu]") {
  // ZeRO-3 only (FSDP refuses offload below it). On cpu the offload path has no copies to make; on
  // cuda:N it moves shards to pinned host memory and back.
  check_parity<Mlp>(fsdp(per_linear(3).cpu_offload(true)), {.optimizer = "sgd"});
  check_parity<Mlp>(fsdp(per_linear(3).cpu_offload(true)), {.optimizer = "adamw"});
}

TEST_CASE("shared_gpu: a state dict saved from the device loads into a plain module and back", "[shared_gpu]") {
  Float64Parity float64;
  const auto device = test_device();
  const std::string base = "/tmp/cpprun_shared_parity_" + std::to_string(::getppid());
  for (const std::string ext : {".pt", ".safetensors"}) {
    for (int stage : {0, 3}) {  // 0: DDP
      INFO(ext << (stage == 0 ? " DDP" : " ZeRO-3"));
      auto wrap = [&](std::shared_ptr<Mlp> net) -> cpprun::DataParallel<Mlp> {
        if (stage == 0) return cpprun::DistributedDataParallel(net, group());
        return cpprun::FullyShardedDataParallel(net, group(), per_linear(stage));
      };
      const std::string path = base + ext;
      torch::manual_seed(7);
      auto net = std::make_shared<Mlp>();
      net->to(device);
      auto reference = std::make_shared<Mlp>();  // on the CPU: what the file must hold
      copy_state(*reference, *net);
      auto model = wrap(net);
      cpprun::save_state_dict(model, path);
      auto plain = std::make_shared<Mlp>();  // on the CPU, other weights until loaded
      cpprun::load_state_dict(plain, path);
      check_same_parameters(*plain, *reference, 0);

      torch::manual_seed(8);  // other weights on the device, then the file's
      auto fresh = std::make_shared<Mlp>();
      fresh->to(device);
      auto fresh_model = wrap(fresh);
      cpprun::load_state_dict(fresh_model, path);
      torch::NoGradGuard no_grad;
      const auto x = inputs_for("mlp", 6, 0);
      const auto out = fresh_model->forward(x.to(device));
      CHECK(out.device() == device);
      // The device's kernels against the CPU's: rounding apart.
      CHECK(relative_difference(out.cpu(), reference->forward(x)) <= kParityTolerance);
      cpprun::barrier(group());
      if (group().rank() == 0) std::filesystem::remove(path);
    }
  }
}
