// vocab_parallel_cross_entropy (cpprun/tensor_parallel.h): cross-entropy over logits split along
// the vocabulary, with three all-reduces of one value per token instead of gathering the logits.
#include <torch/csrc/autograd/custom_function.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "cpprun/tensor_parallel.h"
#include "tp/tp_collectives.h"

namespace cpprun {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct VocabParallelCrossEntropy : torch::autograd::Function<VocabParallelCrossEntropy> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits, const at::Tensor& target,
                            ProcessGroup group, int64_t ignore_index) {
    const int64_t columns = logits.size(-1);
    const int64_t vocab_start = group.rank() * columns;
    // Subtracting the global row maximum keeps exp() finite; it cancels in the loss.
    at::Tensor row_max = tp::all_reduce_max(std::get<0>(logits.max(-1)), group);
    at::Tensor shifted = logits - row_max.unsqueeze(-1);
    // Ignored rows have no target column on any rank; their loss and gradient are zeroed below.
    const at::Tensor ignored = target == ignore_index;
    at::Tensor outside = (target < vocab_start) | (target >= vocab_start + columns) | ignored;
    at::Tensor local_target = (target - vocab_start).masked_fill(outside, 0);
    // The target's (shifted) logit: on the rank holding its column, zero elsewhere, then summed.
    at::Tensor target_logit = shifted.gather(-1, local_target.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0);
    target_logit = tp::all_reduce_sum(target_logit, group);
    at::Tensor exp = shifted.exp();
    at::Tensor sum_exp = tp::all_reduce_sum(exp.sum(-1), group);
    at::Tensor loss = (sum_exp.log() - target_logit).masked_fill(ignored, 0);
    exp.div_(sum_exp.unsqueeze(-1)).masked_fill_(ignored.unsqueeze(-1), 0);  // this rank's softmax columns
    ctx->save_for_backward({exp, local_target, outside});
    return loss;
  }

  // d loss / d logit_j = softmax_j - [j is the target], on this rank's columns only (zero on an
  // ignored row: its softmax was zeroed and it has no target column).
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor& softmax = saved[0];
    const at::Tensor& local_target = saved[1];
    const at::Tensor& outside = saved[2];
    at::Tensor one_hot = at::zeros_like(softmax).scatter_(-1, local_target.unsqueeze(-1),
                                                          outside.logical_not().unsqueeze(-1).to(softmax.dtype()));
    return {(softmax - one_hot) * grads[0].unsqueeze(-1), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor vocab_parallel_cross_entropy(const at::Tensor& logits, const at::Tensor& target, const ProcessGroup& group,
                                        int64_t ignore_index) {
  TORCH_CHECK(group.is_member(), "cpprun::vocab_parallel_cross_entropy: this rank is not a member of the "
              "tensor-parallel group.");
  TORCH_CHECK(logits.dim() >= 1 && logits.dim() == target.dim() + 1 &&
                  logits.sizes().slice(0, logits.dim() - 1) == target.sizes(),
              "cpprun::vocab_parallel_cross_entropy: logits of shape ", logits.sizes(), " need a target of shape ",
              logits.sizes().slice(0, std::max<int64_t>(logits.dim() - 1, 0)), " (one class id per row); got ",
              target.sizes(), ".");
  TORCH_CHECK(at::isIntegralType(target.scalar_type(), /*includeBool=*/false),
              "cpprun::vocab_parallel_cross_entropy: the target holds class ids and must be an integer tensor; got ",
              target.scalar_type(), ".");
  const int64_t vocab = logits.size(-1) * group.size();
  const at::Tensor counted = target.masked_select(target != ignore_index);
  if (counted.numel() > 0) {
    const int64_t low = counted.min().item<int64_t>(), high = counted.max().item<int64_t>();
    TORCH_CHECK(low >= 0 && high < vocab, "cpprun::vocab_parallel_cross_entropy: target ids range over [", low, ", ",
                high, "] (ignore_index ", ignore_index, " aside), but the vocabulary has ", vocab, " classes (",
                logits.size(-1), " on each of ", group.size(), " ranks).");
  }
  return VocabParallelCrossEntropy::apply(logits, target, group, ignore_index);
}

}  // namespace cpprun
