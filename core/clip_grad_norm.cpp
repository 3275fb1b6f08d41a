// See clip_grad_norm.h.
#include "core/clip_grad_norm.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <map>

#include "cpprun/collectives.h"

namespace cpprun::detail {

double clip_grad_norm(const std::vector<GradientToClip>& grads, double max_norm, const ProcessGroup* sum_over,
                      const char* who) {
  TORCH_CHECK(max_norm > 0, who, "::clip_grad_norm: max_norm must be positive, got ", max_norm, ".");
  at::NoGradGuard no_grad;
  // Slot 0: whole gradients; slot 1 + i: those split over the i-th tensor-parallel group, told
  // apart by their ranks (the same order on every rank: a map by ranks). Counted whether or not
  // the grad is defined, so that every rank joins the same all-reduces (an FSDP shard of padding
  // alone may have none).
  std::map<std::vector<int>, std::pair<int64_t, ProcessGroup>> split_groups;
  for (const auto& g : grads) {
    if (!g.split_over) continue;
    auto ranks = get_process_group_ranks(*g.split_over);
    if (!split_groups.count(ranks)) {
      const auto slot = static_cast<int64_t>(split_groups.size()) + 1;
      split_groups.emplace(std::move(ranks), std::make_pair(slot, *g.split_over));
    }
  }
  auto squares = at::zeros({static_cast<int64_t>(split_groups.size()) + 1}, at::kDouble);
  for (const auto& g : grads) {
    if (!g.grad.defined()) continue;
    const int64_t slot = g.split_over ? split_groups.at(get_process_group_ranks(*g.split_over)).first : 0;
    squares[slot] += g.grad.to(at::kDouble).pow(2).sum().cpu();
  }
  if (sum_over) all_reduce(*sum_over, squares);
  double total = squares[0].item<double>();
  for (auto& [ranks, slot_group] : split_groups) {
    auto part = squares.narrow(0, slot_group.first, 1).clone();
    all_reduce(slot_group.second, part);  // the pieces of each split gradient, over its TP group
    total += part.item<double>();
  }
  total = std::sqrt(total);
  const double scale = max_norm / (total + 1e-6);
  if (scale < 1) {
    for (const auto& g : grads) {
      if (g.grad.defined()) g.grad.mul_(scale);
    }
  }
  return total;
}

}  // namespace cpprun::detail
