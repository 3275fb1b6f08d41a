// Per-rank bytes of tensor parallelism at tp = 1, 2 and 4, with and without sequence
// parallelism, next to Megatron's formulas: the parameters a rank holds, the activations one
// forward leaves for backward, and what the TP collectives of one training step move. The model
// is L residual MLP blocks (LayerNorm, Linear H->4H column-parallel, GELU, Linear 4H->H
// row-parallel), fp32, on N = batch x sequence tokens. One job of 4 ranks measures every tp on a
// {4/tp, tp} mesh (the dp dimension only repeats the model; nothing is reduced across it here).
//
//   cpprun --standalone --nproc_per_node=4 build/bench/tp_bytes [--hidden 512 --tokens 2048 --blocks 4]
//
// Parameters: counted from the rank's tensors. Per block: 8H²/t + 4H/t (fc1 rows and bias, fc2
// columns) + H (fc2's bias, whole) + 2H (the LayerNorm).
// Activations: the bytes of CPU tensors alive after the forward less before it and less the
// output (a counting allocator wraps LibTorch's CPU allocator), i.e. what autograd keeps for
// backward. Per block (elements): without sequence parallelism
// the LayerNorm's input and fc1's input (N·H each, whole on every rank), GELU's input and fc2's
// input (N·4H/t each): N·H·(2 + 8/t). With it, the LayerNorm runs on N/t tokens and fc1 keeps its
// input's sequence shard, gathering it again in backward (as Megatron-LM): N·H·10/t, all of it
// falling by t. With ColwiseParallel's keep_gathered_input (PyTorch DTensor's behaviour) fc1 keeps
// the all-gathered input instead: N·H·(1/t + 1 + 8/t). The first block's LayerNorm input is the
// model's input, made before the forward: the formula leaves it out.
// Communication: the collectives the TP layers issued in one forward + backward, read from the
// flight recorder (each one's tensor shapes on this rank), as a ring sends them: an all-reduce of
// E elements 2·(t−1)/t·E·4 bytes, an all-gather or reduce-scatter of E whole (t−1)/t·E·4. Per
// block: without sequence parallelism one all-reduce of N·H in forward (fc2's output) and one in
// backward (fc1's input gradient); with it, an all-gather and a reduce-scatter in each direction
// instead, the same 4·(t−1)/t·N·H·4 bytes, plus fc1's input gathered again in backward
// ((t−1)/t·N·H·4; none with keep_gathered_input), plus three all-reduces of H elements: the
// gradients of the LayerNorm's weight and bias and of fc2's bias, whole on every rank and each
// rank's covering its own tokens (2·(t−1)/t·3H·4).
//
// --check exits 1 unless every measurement is within 1% of its formula (ctest runs it so, small:
// dist.tp_bytes).
#include <cpprun/cpprun.h>
#include <torch/torch.h>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <mutex>
#include <unordered_map>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>

#include "../examples/flag_value.h"

namespace {

// LibTorch's CPU allocator, counting the bytes of the allocations alive. The context of each
// allocation is its data pointer (some kernels take raw pointers and free them through
// raw_deleter), looked up in a table to find what to free and how many bytes it held.
class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* base) : base_(base) {}
  c10::DataPtr allocate(std::size_t bytes) override {
    c10::DataPtr inner = base_->allocate(bytes);
    void* data = inner.get();
    const c10::Device device = inner.device();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      held_.emplace(data, Held{std::move(inner), bytes});
      live_ += static_cast<int64_t>(bytes);
    }
    return {data, data, &release, device};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }
  int64_t live() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return live_;
  }

 private:
  struct Held {
    c10::DataPtr inner;
    std::size_t bytes;
  };
  static void release(void* data);
  c10::Allocator* base_;
  mutable std::mutex mutex_;
  std::unordered_map<void*, Held> held_;
  int64_t live_ = 0;
  friend CountingAllocator* counting_allocator();
};

CountingAllocator* counting_allocator() {
  static CountingAllocator* allocator = [] {
    auto* a = new CountingAllocator(c10::GetCPUAllocator());  // lives as long as the tensors it made
    c10::SetCPUAllocator(a, /*priority=*/1);
    return a;
  }();
  return allocator;
}

void CountingAllocator::release(void* data) {
  CountingAllocator* self = counting_allocator();
  c10::DataPtr inner;  // freed after the lock is released
  std::lock_guard<std::mutex> lock(self->mutex_);
  auto found = self->held_.find(data);
  if (found == self->held_.end()) return;
  self->live_ -= static_cast<int64_t>(found->second.bytes);
  inner = std::move(found->second.inner);
  self->held_.erase(found);
}

struct Sizes {
  int64_t hidden, tokens, blocks;
};

torch::nn::ModuleList make_stack(const Sizes& s) {
  torch::manual_seed(0);
  torch::nn::ModuleList stack;
  for (int64_t b = 0; b < s.blocks; ++b) {
    stack->push_back(torch::nn::Sequential(torch::nn::LayerNorm(torch::nn::LayerNormOptions({s.hidden})),
                                           torch::nn::Linear(s.hidden, 4 * s.hidden), torch::nn::GELU(),
                                           torch::nn::Linear(4 * s.hidden, s.hidden)));
  }
  return stack;
}

at::Tensor residual_forward(torch::nn::ModuleList& stack, at::Tensor x) {
  for (const auto& block : *stack) x = x + block->as<torch::nn::Sequential>()->forward(x);
  return x;
}

struct Measured {
  double parameters = 0, activations = 0, communication = 0;
  int collectives = 0;
};

// Ring bytes of the TP group's collectives among `entries` from index `first` on.
std::pair<double, int> ring_bytes(const std::vector<cpprun::FlightRecorderEntry>& entries, std::size_t first,
                                  const std::vector<int>& tp_ranks) {
  const double t = static_cast<double>(tp_ranks.size());
  double bytes = 0;
  int count = 0;
  for (std::size_t i = first; i < entries.size(); ++i) {
    const auto& e = entries[i];
    if (e.group_ranks != tp_ranks || e.shapes.empty()) continue;
    auto numel = [](const std::vector<int64_t>& shape) {
      double n = 1;
      for (int64_t d : shape) n *= static_cast<double>(d);
      return n;
    };
    ++count;
    if (e.op == "all_reduce") bytes += 2 * (t - 1) / t * numel(e.shapes[0]) * 4;
    else if (e.op.rfind("all_gather", 0) == 0) bytes += (t - 1) / t * numel(e.shapes[0]) * 4;  // the output
    else if (e.op.rfind("reduce_scatter", 0) == 0) bytes += (t - 1) * numel(e.shapes[0]) * 4;  // t-1 chunks
    else --count;
  }
  return {bytes, count};
}

// How activations are laid out between the blocks' layers.
enum class Layout { kWhole, kSequenceParallel, kSequenceParallelKeepGathered };

Measured measure(const Sizes& s, const cpprun::DeviceMesh& mesh, Layout layout) {
  const int64_t t = mesh.size("tp");
  const bool sequence_parallel = layout != Layout::kWhole;
  auto stack = make_stack(s);
  cpprun::ParallelizePlan plan;
  cpprun::ColwiseParallel colwise;
  cpprun::RowwiseParallel rowwise;
  if (sequence_parallel) {
    colwise.input_layouts(cpprun::Shard(1)).keep_gathered_input(layout == Layout::kSequenceParallelKeepGathered);
    rowwise.output_layouts(cpprun::Shard(1));
  }
  for (int64_t b = 0; b < s.blocks; ++b) {
    const std::string name = std::to_string(b) + ".";
    plan.push_back({name + "1", colwise});
    plan.push_back({name + "3", rowwise});
    if (sequence_parallel) plan.push_back({name + "0", cpprun::SequenceParallel()});
  }
  cpprun::parallelize_module(stack.ptr(), mesh, "tp", plan);

  Measured m;
  for (const auto& p : stack->parameters()) m.parameters += static_cast<double>(p.numel()) * 4;

  constexpr int64_t kBatch = 4;
  torch::manual_seed(1);
  at::Tensor x = torch::randn({kBatch, s.tokens / kBatch, s.hidden});
  if (sequence_parallel) x = x.chunk(t, 1)[mesh.coordinate("tp")].contiguous();
  residual_forward(stack, x).sum().backward();  // warm-up: the allocator's and Gloo's first buffers

  for (auto& p : stack->parameters()) p.mutable_grad() = at::Tensor();
  // Collectives hand their tensors back from Gloo's threads a moment after they complete: let the
  // last ones go before each count.
  auto settle = [&] {
    cpprun::barrier(mesh.group("tp"));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  };
  settle();
  const std::size_t first = cpprun::flight_recorder_entries().size();
  const int64_t before = counting_allocator()->live();
  at::Tensor out = residual_forward(stack, x);
  settle();
  m.activations = static_cast<double>(counting_allocator()->live() - before - out.numel() * 4);
  out.sum().backward();
  const auto [bytes, count] = ring_bytes(cpprun::flight_recorder_entries(), first,
                                         cpprun::get_process_group_ranks(mesh.group("tp")));
  m.communication = bytes, m.collectives = count;
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  Sizes s{512, 2048, 4};
  bool check = false;
  try {
    for (examples::Flags flags(argc, argv, "tp_bytes"); flags.next();) {
      if (flags.is("--help")) {
        return examples::print_usage("usage: cpprun --nproc_per_node=4 tp_bytes [--hidden N (512)] [--tokens N (2048, "
                                     "a multiple of 16)] [--blocks N (4)] [--check]\n");
      }
      if (flags.is("--hidden")) s.hidden = flags.number<int64_t>(1);
      else if (flags.is("--tokens")) s.tokens = flags.number<int64_t>(16);
      else if (flags.is("--blocks")) s.blocks = flags.number<int64_t>(1);
      else if (flags.is("--check")) check = true;
      else flags.unknown();
    }
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "tp_bytes: %s\n", e.what());
    return 2;
  }
  counting_allocator();  // before any tensor
  auto pg = cpprun::init_process_group();
  if (pg.size() != 4 || s.tokens % 16 != 0 || s.hidden % 4 != 0) {
    if (pg.rank() == 0) {
      std::fprintf(stderr, "tp_bytes: run with 4 ranks (cpprun --nproc_per_node=4), --tokens a multiple of 16 and "
                           "--hidden of 4\n");
    }
    return 2;
  }
  const double H = static_cast<double>(s.hidden), N = static_cast<double>(s.tokens), L = static_cast<double>(s.blocks);
  if (pg.rank() == 0) {
    std::printf("tensor parallelism, per rank, fp32: %lld blocks, hidden %lld, %lld tokens (MiB; measured / formula)\n",
                static_cast<long long>(s.blocks), static_cast<long long>(s.hidden), static_cast<long long>(s.tokens));
    std::printf("%-4s %-4s %-26s %-26s %-30s %s\n", "tp", "sp", "parameters", "activations after forward",
                "TP communication per step", "collectives");
  }
  constexpr double kMiB = 1024.0 * 1024.0;
  bool within = true;
  auto near = [](double measured, double formula, double tolerance) {
    return formula == 0 ? measured == 0 : std::abs(measured / formula - 1) <= tolerance;
  };
  for (int t : {1, 2, 4}) {
    cpprun::DeviceMesh mesh(pg, {4 / t, t}, {"dp", "tp"});
    for (Layout layout : {Layout::kWhole, Layout::kSequenceParallel, Layout::kSequenceParallelKeepGathered}) {
      const bool sp = layout != Layout::kWhole, kept = layout == Layout::kSequenceParallelKeepGathered;
      if (sp && t == 1) continue;
      const Measured m = measure(s, mesh, layout);
      const double params = L * (8 * H * H / t + 4 * H / t + 3 * H) * 4;
      const double per_block = !sp ? 2 + 8.0 / t : kept ? 1.0 / t + 1 + 8.0 / t : 10.0 / t;
      const double acts = (L * N * H * per_block - N * H / (sp ? t : 1)) * 4;
      const double regather = sp && !kept ? (t - 1.0) / t * N * H : 0;
      const double comm = L * (4.0 * (t - 1) / t * N * H + regather + (sp ? 2.0 * (t - 1) / t * 3 * H : 0)) * 4;
      if (!near(m.parameters, params, 0.01) || !near(m.communication, comm, 0.01) ||
          !near(m.activations, acts, 0.01)) {
        within = false;
        std::fprintf(stderr, "tp_bytes: rank %d, tp %d%s: parameters %.0f (formula %.0f), activations %.0f (%.0f), "
                     "communication %.0f (%.0f) bytes\n", pg.rank(), t, !sp ? "" : kept ? " sp kept" : " sp",
                     m.parameters, params,
                     m.activations, acts, m.communication, comm);
      }
      if (pg.rank() == 0) {
        std::printf("%-4d %-4s %8.2f / %-8.2f (%4.2fx) %8.2f / %-8.2f (%4.2fx) %9.2f / %-9.2f (%4.2fx) %d\n", t,
                    !sp ? "no" : kept ? "kept" : "yes", m.parameters / kMiB, params / kMiB, m.parameters / params,
                    m.activations / kMiB, acts / kMiB, m.activations / acts, m.communication / kMiB, comm / kMiB,
                    comm > 0 ? m.communication / comm : 1.0, m.collectives);
      }
    }
  }
  if (check && !within) {
    std::fprintf(stderr, "tp_bytes: rank %d: a measurement is off its formula, above (--check: parameters and "
                         "communication and activations within 1%%)\n", pg.rank());
    return 1;
  }
  return 0;
}
