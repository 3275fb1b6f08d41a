// See clip_grad_norm.h.
#include "core/clip_grad_norm.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cmath>

#include "cpprun/collectives.h"

namespace cpprun::detail {

double clip_grad_norm(const std::vector<at::Tensor>& grads, double max_norm, const ProcessGroup* sum_over,
                      const char* who) {
  TORCH_CHECK(max_norm > 0, who, "::clip_grad_norm: max_norm must be positive, got ", max_norm, ".");
  at::NoGradGuard no_grad;
  auto squares = at::zeros({1}, at::kDouble);
  for (const auto& grad : grads) {
    if (grad.defined()) squares += grad.to(at::kDouble).pow(2).sum().cpu();
  }
  if (sum_over) all_reduce(*sum_over, squares);
  const double total = std::sqrt(squares.item<double>());
  const double scale = max_norm / (total + 1e-6);
  if (scale < 1) {
    for (const auto& grad : grads) {
      if (grad.defined()) grad.mul_(scale);
    }
  }
  return total;
}

}  // namespace cpprun::detail
