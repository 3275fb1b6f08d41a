// The C++ side of fsdp_controls_pytorch.sh: two ranks train a float64 MLP under cpprun's
// FullyShardedDataParallel (ZeRO-3, a unit per Linear) with FSDP2's controls, rank 0 writing the
// initial weights, the data and each case's trained parameters for fsdp_controls_pytorch.py, which
// trains the same with PyTorch's fully_shard and the same calls and compares.
//   cpprun --nproc_per_node=2 fsdp_controls_pytorch DIR
// Cases (3 micro-batches per step, 2 steps, SGD):
//   accumulate: set_requires_gradient_sync and set_reshard_after_backward true for the last
//     micro-batch only (torchtitan's and PyTorch's pipeline schedules' pattern), over 2 ranks;
//   hsdp: a 2 x 1 (replicate x shard) mesh; micro-batch 0 local, 1 set_requires_all_reduce(false),
//     2 all-reduced;
//   divide: set_gradient_divide_factor(3) over 2 ranks (float64: FSDP2 divides by 2 before the
//     reduce-scatter and by 1.5 after it);
//   divide_sum: the same with reduce_dtype float32 and set_force_sum_reduction_for_comms(true): a
//     float32 sum of the gradients rounded to float32, divided by 3 after it (without force_sum,
//     FSDP2 would multiply by 1/3 before it, a PREMUL_SUM, which Gloo lacks: other bits).
//   hook: set_gradient_divide_factor(3) and set_all_reduce_hook adding 0.01 to the reduced rows, in
//     float64: FSDP2 calls it between the reduce-scatter and the division by 1.5 after it.
//   mixed: accumulate's calls under mixed precision, param_dtype bf16 and the reduce dtype left to
//     its default: FSDP2 (since 2.15) reduces in the parameters' dtype, float64 here, and
//     accumulates the local micro-batches' bf16 gradients in it (cpprun's Note [Local gradients in
//     the reduce dtype]).
//   frozen: mixed's calls and precision with fc1.weight frozen (requires_grad false) before
//     wrapping, a LoRA-style fine-tune: FSDP2 shards and casts frozen parameters and reduces none
//     of their gradients; fc1.weight must come out as it went in.
// Each micro-batch synchronized in divide, divide_sum and hook.
#include <torch/torch.h>

#include <cstdio>
#include <string>
#include <vector>

#include "checkpoint/state_dict.h"
#include "cpprun/cpprun.h"

namespace {

constexpr int kSteps = 2, kMicro = 3, kBatch = 8;  // kBatch: the global batch of a micro-batch

struct Net : torch::nn::Module {
  torch::nn::Linear fc1 = register_module("fc1", torch::nn::Linear(6, 9));
  torch::nn::Linear fc2 = register_module("fc2", torch::nn::Linear(9, 4));
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::tanh(fc1(x))); }
};

bool is_linear(const torch::nn::Module& m) { return dynamic_cast<const torch::nn::LinearImpl*>(&m) != nullptr; }

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && std::string(argv[1]) == "--torch-version") {
    std::printf("%d.%d.%d\n", TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR, TORCH_VERSION_PATCH);
    return 0;
  }
  if (argc != 2) {
    std::fprintf(stderr, "usage: cpprun --nproc_per_node=2 fsdp_controls_pytorch DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  auto group = cpprun::init_process_group();
  TORCH_CHECK(group.size() == 2, "fsdp_controls_pytorch runs on 2 ranks, got ", group.size());
  const int rank = group.rank();
  torch::set_default_dtype(caffe2::TypeMeta::Make<double>());
  cpprun::detail::NamedTensors out;
  torch::manual_seed(0);
  Net init;
  for (const auto& p : init.named_parameters()) out.emplace_back("init." + p.key(), p.value().detach().clone());
  torch::manual_seed(1);
  const auto x = torch::randn({kSteps * kMicro, kBatch, 6});
  const auto y = torch::randint(0, 4, {kSteps * kMicro, kBatch}, torch::kLong);
  out.emplace_back("x", x);
  out.emplace_back("y", y);
  const cpprun::DeviceMesh mesh(group, {2, 1}, {"replicate", "shard"});

  for (const std::string kind : {"accumulate", "hsdp", "divide", "divide_sum", "hook", "mixed", "frozen"}) {
    auto net = std::make_shared<Net>();
    {
      torch::NoGradGuard no_grad;
      for (const auto& p : net->named_parameters()) p.value().copy_(init.named_parameters()[p.key()]);
    }
    if (kind == "frozen") net->fc1->weight.requires_grad_(false);
    auto options = cpprun::FsdpOptions().stage(3).wrap_policy(is_linear);
    if (kind == "divide_sum") options.reduce_dtype(at::kFloat);
    if (kind == "mixed" || kind == "frozen") options.param_dtype(at::kBFloat16);
    auto model = kind == "hsdp" ? cpprun::FullyShardedDataParallel(net, mesh, options)
                                : cpprun::FullyShardedDataParallel(net, group, options);
    if (kind == "divide" || kind == "divide_sum" || kind == "hook") model->set_gradient_divide_factor(3.0);
    if (kind == "hook") model->set_all_reduce_hook([](const torch::Tensor& rows) { rows.add_(0.01); });
    if (kind == "divide_sum") model->set_force_sum_reduction_for_comms(true);
    torch::optim::SGD opt(model->parameters(), 0.1);
    for (int step = 0; step < kSteps; ++step) {
      opt.zero_grad();
      for (int micro = 0; micro < kMicro; ++micro) {
        const bool last = micro == kMicro - 1;
        if (kind == "accumulate" || kind == "mixed" || kind == "frozen") {
          model->set_requires_gradient_sync(last);
          model->set_reshard_after_backward(last);
        } else if (kind != "hsdp") {
          // every micro-batch synchronized
        } else if (micro == 0) {
          model->set_requires_gradient_sync(false);
        } else if (micro == 1) {
          model->set_requires_gradient_sync(true);
          model->set_requires_all_reduce(false);
        } else {
          model->set_requires_all_reduce(true);
        }
        const int b = step * kMicro + micro;
        const auto local_x = x[b].narrow(0, rank * kBatch / 2, kBatch / 2);
        const auto local_y = y[b].narrow(0, rank * kBatch / 2, kBatch / 2);
        torch::nn::functional::cross_entropy(model->forward(local_x), local_y).backward();
      }
      opt.step();
    }
    // The masters (mixed's float64, not its bf16 compute copies), as FSDP2's full_tensor().
    for (const auto& item : cpprun::get_model_state_dict(model)) {
      out.emplace_back(kind + "." + item.key(), item.value().clone());
    }
  }
  if (rank == 0) {
    cpprun::detail::write_state_dict_file(out, dir + "/cpprun.safetensors", cpprun::StateDictSaveOptions(), {});
  }
  cpprun::barrier(group);
  return 0;
}
