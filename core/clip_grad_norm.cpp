// See clip_grad_norm.h.
#include "core/clip_grad_norm.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cmath>

#include "core/tensor_parallel_splits.h"
#include "cpprun/collectives.h"

namespace cpprun::detail {

double clip_grad_norm(const std::vector<GradientToClip>& grads, double max_norm, const ProcessGroup* sum_over,
                      const char* who, const ProcessGroup* then_over) {
  TORCH_CHECK(max_norm > 0, who, "::clip_grad_norm: max_norm must be positive, got ", max_norm, ".");
  at::NoGradGuard no_grad;
  // Slot 0: whole gradients; slot 1 + i: those split over the i-th distinct tensor-parallel
  // group. Counted whether or not the grad is defined, so that every rank joins the same
  // all-reduces (an FSDP shard of padding alone may have none).
  std::vector<const ProcessGroup*> split_over;
  for (const auto& g : grads) {
    if (g.split_over) split_over.push_back(&*g.split_over);
  }
  std::vector<int64_t> group_of_split;  // per split gradient, in grads' order
  const std::vector<ProcessGroup> tp_groups = distinct_groups(split_over, &group_of_split);
  auto squares = at::zeros({static_cast<int64_t>(tp_groups.size()) + 1}, at::kDouble);
  size_t split_index = 0;
  for (const auto& g : grads) {
    const int64_t slot = g.split_over ? 1 + group_of_split[split_index++] : 0;
    if (g.grad.defined() && g.counted) squares[slot] += g.grad.to(at::kDouble).pow(2).sum().cpu();
  }
  // The pieces of each split gradient first, over its TP group; then this rank's total over the
  // groups that share the gradients out. In that order a rank whose gradients are all whole (a
  // pipeline stage without TP-split layers, beside stages with them) joins the same sums as the
  // others: one number each.
  for (size_t i = 0; i < tp_groups.size(); ++i) {
    auto part = squares.narrow(0, static_cast<int64_t>(i) + 1, 1).clone();
    all_reduce(tp_groups[i], part);
    squares.narrow(0, static_cast<int64_t>(i) + 1, 1).copy_(part);
  }
  at::Tensor total_squares = squares.sum().reshape({1});
  if (sum_over) all_reduce(*sum_over, total_squares);
  if (then_over) all_reduce(*then_over, total_squares);
  const double total = std::sqrt(total_squares.item<double>());
  const double scale = max_norm / (total + 1e-6);
  // As torch.nn.utils.clip_grad_norm_ (error_if_nonfinite=False): a NaN total multiplies every
  // gradient by NaN, an infinite one by 0, so that the step that follows is as PyTorch's.
  if (!(scale >= 1)) {
    for (const auto& g : grads) {
      if (g.grad.defined()) g.grad.mul_(scale);
    }
  }
  return total;
}

}  // namespace cpprun::detail
