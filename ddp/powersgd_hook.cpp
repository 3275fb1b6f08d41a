// PyTorch's PowerSGD communication hook (torch/distributed/algorithms/ddp_comm_hooks/
// powerSGD_hook.py) for cpprun's DDP: the same decisions, memory layout and random numbers, so
// that a model trains to PyTorch's parameters. See cpprun/comm_hooks.h.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "cpprun/comm_hooks.h"
#include "ddp/powersgd_state.h"

namespace cpprun {
namespace {

using detail::FactorSizes;

// _orthogonalize: Gram-Schmidt for rank <= 2 or 16-bit floats, else QR, in place; `matrices` is
// [batch, rows, rank].
void orthogonalize(const at::Tensor& matrices, double epsilon) {
  const int64_t columns = matrices.size(2);
  const auto dtype = matrices.scalar_type();
  if (columns > 2 && dtype != at::kHalf && dtype != at::kBFloat16) {
    matrices.copy_(std::get<0>(at::linalg_qr(matrices)));
    return;
  }
  for (int64_t i = 0; i < columns; ++i) {
    at::Tensor column = matrices.narrow(2, i, 1);
    const at::Tensor norm = at::linalg_vector_norm(column, 2, at::IntArrayRef{1}, /*keepdim=*/true);
    if (epsilon == 0) {
      column.div_(norm);
    } else {
      column.div_(norm + epsilon);
    }
    if (i + 1 < columns) {
      at::Tensor rest = matrices.narrow(2, i + 1, columns - i - 1);
      rest.sub_(at::sum(column * rest, at::IntArrayRef{1}, /*keepdim=*/true) * column);
    }
  }
}

// A bucket's gradients as PyTorch's hook splits them: the [rows, rest] matrices worth compressing,
// the rest, and the P and Q elements the matrices need.
struct Split {
  std::vector<at::Tensor> matrices, uncompressed;
  FactorSizes factors;
};

Split split(const GradBucket& bucket, const PowerSGDOptions& options) {
  Split out;
  for (const at::Tensor& tensor : bucket.gradients()) {
    const at::Tensor matrix = tensor.dim() == 0 ? tensor.view({1, 1}) : tensor.view({tensor.size(0), -1});
    const int64_t n = matrix.size(0), m = matrix.size(1);
    const int64_t rank = std::min({n, m, options.matrix_approximation_rank()});
    if (static_cast<double>((n + m) * rank) * options.min_compression_rate() < static_cast<double>(n * m)) {
      out.matrices.push_back(matrix);
      out.factors.p += n * rank;
      out.factors.q += m * rank;
    } else {
      out.uncompressed.push_back(tensor);
    }
  }
  return out;
}

class PowerSgdHook : public CommHook {
 public:
  explicit PowerSgdHook(const PowerSGDOptions& options) : state_(options) {
    TORCH_CHECK(options.matrix_approximation_rank() >= 1, "cpprun::powerSGD_hook: matrix_approximation_rank must be "
                "at least 1, got ", options.matrix_approximation_rank(), ".");
    TORCH_CHECK(!(options.use_error_feedback() || options.warm_start()) || options.start_powerSGD_iter() > 1,
                "cpprun::powerSGD_hook: start_powerSGD_iter must be above 1 when use_error_feedback or warm_start is on "
                "(PowerSGD can only start after DDP's first two steps, as PyTorch's), got ",
                options.start_powerSGD_iter(), ".");
  }

  Work run(const ProcessGroup& group, GradBucket& bucket) override {
    const at::Tensor input = bucket.buffer;
    const int world = group.size();
    const bool compressing = state_.iter >= options().start_powerSGD_iter();
    Split parts = compressing ? split(bucket, options()) : Split{};
    // Note [A PowerSGD state fits one layout]: a bucket index's first run agrees across ranks.
    if (state_.agreed_buckets.count(bucket.index)) {
      detail::check_state_fits(state_, group.rank(), world, bucket, compressing, parts.factors);
    } else {
      detail::agree_state_fits(state_, group, bucket, compressing, parts.factors);
    }
    if (!compressing) {
      increase_iter(bucket);
      input.div_(world);  // as PyTorch's _allreduce_fut: divided, then summed
      return all_reduce_async(group, input, ReduceOp::kSum);
    }
    at::NoGradGuard no_grad;
    Work work = compress_and_reduce(group, bucket, std::move(parts));
    increase_iter(bucket);
    return work;
  }

  std::string name() const override { return "powerSGD"; }
  detail::PowerSgdState& state() { return state_; }

 private:
  const PowerSGDOptions& options() const { return state_.options; }

  void increase_iter(const GradBucket& bucket) {
    if (bucket.is_last) ++state_.iter;
  }

  // Note [PowerSGD's chain of work]
  // PyTorch's hook returns a chain of futures (the uncompressed all-reduce, then P's, then Q's),
  // so autograd's thread goes on with the backward while its bucket communicates. Here the part
  // that needs this step's gradients only (error feedback, P = M Q) runs on the backward's thread,
  // which then issues the all-reduces of the uncompressed gradients and of P and returns; the
  // rest (orthogonalize P, Q = M^T P, Q's all-reduce, M = P Q^T, the new error) is the work's
  // then-step, run when DDP waits for this bucket at the end of the backward. Collectives are
  // matched by the order ranks issue them: buckets are launched in index order on every rank
  // (Note [Same reduction order on every rank]) and waited in index order, so every rank issues
  // U0 P0 U1 P1 ... then Q0 Q1 ... (a rank that has joined too: Reducer::reduce_as_joined_rank);
  // the same operations on the same values as when each was waited in turn, so the numbers are
  // bit for bit those of the blocking hook. The step reads
  // the bucket's buffer (M), which nothing writes between launch and wait, and the state, under
  // the Reducer's lock as the other buckets' first halves are.
  Work compress_and_reduce(const ProcessGroup& group, GradBucket& bucket, Split parts) {
    const at::Tensor input = bucket.buffer;
    const int index = bucket.index;
    at::Tensor input_copy;
    if (options().use_error_feedback()) {
      auto error = state_.error_dict.find(index);
      if (error != state_.error_dict.end()) {
        input.add_(error->second);
      } else {
        state_.error_dict[index] = at::zeros_like(input);
      }
      input_copy = input.clone();
    }

    const std::vector<at::Tensor>& matrices = parts.matrices;
    const std::vector<at::Tensor> uncompressed = std::move(parts.uncompressed);
    const int64_t p_size = parts.factors.p, q_size = parts.factors.q;
    std::vector<at::Tensor> flat_uncompressed;
    for (const auto& t : uncompressed) flat_uncompressed.push_back(t.reshape(-1));
    const at::Tensor uncompressed_memory =
        flat_uncompressed.empty() ? at::empty({0}, input.options()) : at::cat(flat_uncompressed);

    const bool randomize = !options().warm_start() || state_.p_memory_dict.find(index) == state_.p_memory_dict.end();
    if (randomize) {
      state_.p_memory_dict[index] = at::empty({p_size}, input.options());
      state_.q_memory_dict[index] = at::empty({q_size}, input.options());
    }
    const at::Tensor p_memory = state_.p_memory_dict[index], q_memory = state_.q_memory_dict[index];
    // check_state_fits refused a loaded state whose P and Q do not fit; the hook's own always do.
    TORCH_INTERNAL_ASSERT(p_memory.numel() == p_size && q_memory.numel() == q_size, "cpprun::powerSGD_hook: bucket ",
                          index, " holds P and Q memory of ", p_memory.numel(), " and ", q_memory.numel(),
                          " elements where it needs ", p_size, " and ", q_size, ".");

    // Grouped by shape, in the order each shape first appears (a Python dict), batched or one by one.
    std::vector<std::pair<std::vector<int64_t>, std::vector<at::Tensor>>> by_shape;
    for (const auto& matrix : matrices) {
      const std::vector<int64_t> shape = matrix.sizes().vec();
      auto found = std::find_if(by_shape.begin(), by_shape.end(), [&](const auto& g) { return g.first == shape; });
      if (found == by_shape.end()) found = by_shape.insert(by_shape.end(), {shape, {}});
      found->second.push_back(matrix);
    }
    std::vector<at::Tensor> batches, ps, qs;
    int64_t p_at = 0, q_at = 0;
    for (const auto& [shape, group_matrices] : by_shape) {
      std::vector<at::Tensor> items;
      if (options().batch_tensors_with_same_shape()) {
        items.push_back(group_matrices.size() == 1 ? group_matrices[0].unsqueeze(0) : at::stack(group_matrices));
      } else {
        for (const auto& matrix : group_matrices) items.push_back(matrix.unsqueeze(0));
      }
      for (const auto& batch : items) {
        const int64_t b = batch.size(0), n = batch.size(1), m = batch.size(2);
        const int64_t rank = std::min({n, m, options().matrix_approximation_rank()});
        batches.push_back(batch);
        ps.push_back(p_memory.narrow(0, p_at, b * n * rank).view({b, n, rank}));
        qs.push_back(q_memory.narrow(0, q_at, b * m * rank).view({b, m, rank}));
        p_at += b * n * rank;
        q_at += b * m * rank;
      }
    }

    if (!randomize) {
      for (const auto& q : qs) orthogonalize(q, options().orthogonalization_epsilon());
    } else {
      // torch.manual_seed(rng.randint(1e9)) inside fork_rng, then torch.randn on the CPU: a
      // generator of its own seeded alike draws the same numbers and leaves the global one as it was.
      auto generator = at::make_generator<at::CPUGeneratorImpl>(state_.rng.randint_below_one_billion());
      for (const auto& q : qs) {
        q.copy_(at::randn(q.sizes(), generator, at::TensorOptions().dtype(input.scalar_type())));
        orthogonalize(q, options().orthogonalization_epsilon());
      }
    }
    for (size_t i = 0; i < batches.size(); ++i) at::bmm_out(ps[i], batches[i], qs[i]);

    // The uncompressed gradients and P summed while the backward goes on; the rest once DDP
    // waits for this bucket. See Note [PowerSGD's chain of work].
    Work uncompressed_sum = all_reduce_async(group, uncompressed_memory, ReduceOp::kSum);
    Work p_sum = all_reduce_async(group, p_memory, ReduceOp::kSum);
    return p_sum.then([this, group, index, input, input_copy, uncompressed, uncompressed_memory, batches, ps, qs,
                       q_memory, by_shape, uncompressed_sum]() mutable {
      at::NoGradGuard no_grad;
      const int world = group.size();
      uncompressed_sum.wait();
      uncompressed_memory.div_(world);
      int64_t at = 0;
      for (const auto& tensor : uncompressed) {
        tensor.copy_(uncompressed_memory.narrow(0, at, tensor.numel()).view_as(tensor));
        at += tensor.numel();
      }
      // P orthogonalized; Q = M^T P, averaged.
      for (const auto& p : ps) orthogonalize(p, options().orthogonalization_epsilon());
      for (size_t i = 0; i < batches.size(); ++i) at::bmm_out(qs[i], batches[i].transpose(1, 2), ps[i]);
      all_reduce(group, q_memory, ReduceOp::kSum);
      q_memory.div_(world);
      // M ~ P Q^T, written into the bucket through the matrices' views.
      for (size_t i = 0; i < batches.size(); ++i) at::bmm_out(batches[i], ps[i], qs[i].transpose(1, 2));
      if (options().batch_tensors_with_same_shape()) {
        size_t item = 0;
        for (const auto& [shape, group_matrices] : by_shape) {
          const at::Tensor& batch = batches[item++];
          if (batch.size(0) == 1) continue;
          for (size_t k = 0; k < group_matrices.size(); ++k) group_matrices[k].copy_(batch[k]);
        }
      }
      if (options().use_error_feedback()) state_.error_dict[index] = input_copy - input;
      // PyTorch clears both dicts here; only this bucket's entries: the later buckets' P and Q,
      // made already, are in use until their own step (the dicts are empty once all have run).
      if (!options().warm_start()) {
        state_.p_memory_dict.erase(index);
        state_.q_memory_dict.erase(index);
      }
    });
  }

  detail::PowerSgdState state_;
};

}  // namespace

namespace detail {

PowerSgdState& powersgd_state_of(CommHook& hook, const char* caller) {
  auto* powersgd = dynamic_cast<PowerSgdHook*>(&hook);
  TORCH_CHECK(powersgd != nullptr, caller, ": the hook is ", hook.name(), ", not one that cpprun::powerSGD_hook() "
              "made; only PowerSGD's hook has a state to save or load.");
  return powersgd->state();
}

}  // namespace detail

std::shared_ptr<CommHook> powerSGD_hook(const PowerSGDOptions& options) {
  return std::make_shared<PowerSgdHook>(options);
}

}  // namespace cpprun
