// Bytes each rank sends per training step under plain ZeRO-3 over every rank and under HSDP
// (ZeRO-3 sharded over S ranks, R replicas), next to the formulas. 4 ranks: HSDP is 2 x 2.
//
//   cpprun --standalone --nproc_per_node=4 build/bench/hsdp_bytes
//
// Measured: all-gathers and reduce-scatters run on cpprun's own ring, which counts the bytes each
// rank sends per group (GroupImpl::p2p_bytes_sent). Computed: the replicas' all-reduce of the
// gradient shards runs on Gloo's all-reduce, which counts nothing; it is one all-reduce of each
// unit's shard (Ψ/S elements in all) per step, 2·(R−1)/R·Ψ/S·4 bytes as a ring sends.
// The replicate group's ring counter is printed too: it stays 0 (no parameter crosses replicas).
//
// ZeRO-3 per step: forward all-gathers every unit, backward all-gathers every unit again except
// the one forward used last (it stays for backward), and reduce-scatters every gradient:
// (3Ψ − Ψ_last)·(N−1)/N·4 bytes per rank, ≈ 3·Ψ·(N−1)/N·4; Ψ counts padding (each parameter's
// rows are padded to a multiple of the ranks it is sharded over).
#include <cpprun/cpprun.h>
#include <torch/torch.h>

#include <cstdio>

#include "comm/group_impl.h"  // p2p_bytes_sent

namespace {

constexpr int64_t kHidden = 512;

struct Net : torch::nn::Module {
  torch::nn::Sequential blocks;
  torch::nn::Linear head{nullptr};
  Net() {
    for (int i = 0; i < 4; ++i) blocks->push_back(torch::nn::Linear(kHidden, kHidden));
    blocks = register_module("blocks", blocks);
    head = register_module("head", torch::nn::Linear(kHidden, 8));  // used last in forward
  }
  torch::Tensor forward(torch::Tensor x) { return head(torch::relu(blocks->forward(x))); }
};

bool is_linear(const torch::nn::Module& m) { return dynamic_cast<const torch::nn::LinearImpl*>(&m) != nullptr; }

uint64_t sent(const cpprun::ProcessGroup& group) { return cpprun::detail::impl_of(group).p2p_bytes_sent; }

struct StepBytes {
  double shard = 0, replicate_ring = 0;
  int64_t padded = 0, padded_last = 0;  // Ψ and the last unit's share, padded for the shard group
};

// Bytes this rank sent in one step (after one step of warm-up).
// Elements of `module`'s parameters, each padded to a multiple of `ranks` rows.
int64_t padded(torch::nn::Module& module, int ranks) {
  int64_t n = 0;
  for (const auto& p : module.parameters()) n += (p.size(0) + ranks - 1) / ranks * ranks * (p.numel() / p.size(0));
  return n;
}

StepBytes measure(const cpprun::ProcessGroup& whole, const cpprun::ProcessGroup& shard,
                  const cpprun::ProcessGroup* replicate, const cpprun::FsdpOptions& options,
                  const cpprun::DeviceMesh* mesh = nullptr) {
  torch::manual_seed(0);
  auto net = std::make_shared<Net>();
  auto model = mesh ? cpprun::FullyShardedDataParallel(net, *mesh, options)
                    : cpprun::FullyShardedDataParallel(net, whole, options);
  torch::optim::SGD opt(model->parameters(), 0.01);
  auto step = [&] {
    opt.zero_grad();
    model->forward(torch::randn({8, kHidden})).pow(2).mean().backward();
    opt.step();
  };
  step();
  const uint64_t shard_before = sent(shard), replicate_before = replicate ? sent(*replicate) : 0;
  step();
  StepBytes bytes;
  bytes.shard = static_cast<double>(sent(shard) - shard_before);
  bytes.replicate_ring = replicate ? static_cast<double>(sent(*replicate) - replicate_before) : 0;
  bytes.padded = padded(*net, shard.size());
  bytes.padded_last = padded(*net->head, shard.size());  // the head: the last unit planned
  return bytes;
}

}  // namespace

int main() {
  torch::set_num_threads(1);
  auto whole = cpprun::init_process_group();
  const int n = whole.size();
  if (n != 4) {
    if (whole.rank() == 0) std::printf("hsdp_bytes: run it on 4 ranks (2 replicas x 2 shards), not %d\n", n);
    return 1;
  }
  const auto base = cpprun::FsdpOptions().stage(3).wrap_policy(is_linear);
  const StepBytes zero3 = measure(whole, whole, nullptr, base);
  cpprun::DeviceMesh mesh(whole, {2, 2}, {"replicate", "shard"});
  const int r = mesh.size(0), s = mesh.size(1);
  const StepBytes hsdp = measure(whole, mesh.group("shard"), &mesh.group("replicate"), base, &mesh);
  if (whole.rank() != 0) return 0;

  const double f = 4.0;  // fp32
  const double zero3_exact = (3.0 * zero3.padded - zero3.padded_last) * (n - 1) / n * f;
  const double zero3_approx = 3.0 * zero3.padded * (n - 1) / n * f;
  const double shard_exact = (3.0 * hsdp.padded - hsdp.padded_last) * (s - 1) / s * f;
  const double replicate = 2.0 * (r - 1) / r * hsdp.padded / s * f;
  std::printf("Psi = %lld parameters (padded for 4 ranks; %lld padded for 2), fp32, ZeRO-3, one unit per Linear\n",
              static_cast<long long>(zero3.padded), static_cast<long long>(hsdp.padded));
  std::printf("%-34s %14s %16s  %s\n", "bytes sent per rank per step", "measured", "formula", "formula");
  std::printf("%-34s %14.0f %16.0f  (3Psi - Psi_last)(N-1)/N*4, N=%d (~3Psi(N-1)/N*4 = %.0f)\n",
              "ZeRO-3 over all ranks", zero3.shard, zero3_exact, n, zero3_approx);
  std::printf("%-34s %14.0f %16.0f  (3Psi - Psi_last)(S-1)/S*4, S=%d\n", "HSDP: shard group (within a node)",
              hsdp.shard, shard_exact, s);
  std::printf("%-34s %14s %16.0f  2(R-1)/R*Psi/S*4, R=%d (computed: Gloo all-reduce)\n",
              "HSDP: replicate group (across)", "-", replicate, r);
  std::printf("%-34s %14.0f %16d  no all-gather or reduce-scatter crosses replicas\n",
              "HSDP: replicate group, ring bytes", hsdp.replicate_ring, 0);
  // ZeRO-3's collectives span every rank, the slow dimension included; HSDP's only its all-reduce.
  std::printf("on collectives spanning the replica (slow) dimension: HSDP %.0f vs ZeRO-3 %.0f bytes per rank "
              "(%.1fx less)\n", replicate, zero3.shard, zero3.shard / replicate);
  return 0;
}
