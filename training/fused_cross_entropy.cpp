// See cpprun/fused_cross_entropy.h. The checks, the autograd function and the reductions are
// shared by both devices; only the per-row work differs (CUDA: training/cross_entropy_rows.h; the
// CPU: ATen's own operations below).
#include "cpprun/fused_cross_entropy.h"

#include <torch/csrc/autograd/custom_function.h>

#include <ATen/ATen.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>

#include <exception>
#include <string>
#include <variant>

#include "training/cross_entropy_rows.h"

namespace cpprun {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

enum class Reduction : int64_t { none, mean, sum };

Reduction reduction_of(const torch::nn::functional::CrossEntropyFuncOptions::reduction_t& reduction) {
  if (std::holds_alternative<torch::enumtype::kNone>(reduction)) return Reduction::none;
  if (std::holds_alternative<torch::enumtype::kSum>(reduction)) return Reduction::sum;
  return Reduction::mean;
}

// The CPU's rows: ATen's vectorised logsumexp and a gather. A target outside [0, C) is refused here,
// as F::cross_entropy refuses it on the CPU (the check costs nothing the CPU would not wait for).
detail::CrossEntropyRows cross_entropy_rows_cpu(const at::Tensor& logits, const at::Tensor& target,
                                                int64_t ignore_index) {
  const at::Tensor x = logits.to(detail::cross_entropy_accumulate_dtype(logits));
  const at::Tensor ignored = target == ignore_index;
  const at::Tensor outside = ((target < 0) | (target >= logits.size(1))) & ignored.logical_not();
  if (outside.any().item<bool>()) {
    const int64_t row = outside.nonzero()[0][0].item<int64_t>();
    TORCH_CHECK(false, "cpprun::fused_cross_entropy: target ", target[row].item<int64_t>(), " of row ", row,
                " is outside the ", logits.size(1), " classes [0, ", logits.size(1), ") and is not ignore_index (",
                ignore_index, ")");
  }
  at::Tensor lse = at::logsumexp(x, {1});
  const at::Tensor picked = x.gather(1, target.masked_fill(ignored, 0).unsqueeze(1)).squeeze(1);
  return {(lse - picked).masked_fill(ignored, 0), lse};
}

at::Tensor cross_entropy_grad_cpu(const at::Tensor& logits, const at::Tensor& target, int64_t ignore_index,
                                  const at::Tensor& row_lse, const at::Tensor& row_scale) {
  const at::Tensor ignored = target == ignore_index;
  const at::Tensor scale = row_scale.masked_fill(ignored, 0).unsqueeze(1);
  at::Tensor grad =
      (logits.to(detail::cross_entropy_accumulate_dtype(logits)) - row_lse.unsqueeze(1)).exp_().mul_(scale);
  grad.scatter_add_(1, target.masked_fill(ignored, 0).unsqueeze(1), scale.neg());
  return grad.to(logits.scalar_type());
}

struct FusedCrossEntropy : torch::autograd::Function<FusedCrossEntropy> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits, const at::Tensor& target,
                            int64_t ignore_index, int64_t reduction) {
    const detail::CrossEntropyRows rows = logits.is_cuda()
                                              ? detail::cross_entropy_rows_cuda(logits, target, ignore_index)
                                              : cross_entropy_rows_cpu(logits, target, ignore_index);
    ctx->saved_data["ignore_index"] = ignore_index;
    ctx->saved_data["reduction"] = reduction;
    if (static_cast<Reduction>(reduction) != Reduction::mean) {
      ctx->save_for_backward({logits, target, rows.lse, at::Tensor()});  // no count: only mean divides by it
      return static_cast<Reduction>(reduction) == Reduction::none ? rows.loss : rows.loss.sum();
    }
    // The rows that count, on the device: no wait for it on the host.
    const at::Tensor counted = (target != ignore_index).sum().to(rows.loss.scalar_type());
    ctx->save_for_backward({logits, target, rows.lse, counted});
    return rows.loss.sum() / counted;  // NaN when every row is ignored, as PyTorch's mean
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);  // as in the forward
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& logits = saved[0];
    const at::Tensor& target = saved[1];
    const at::Tensor& row_lse = saved[2];
    const at::Tensor& counted = saved[3];
    const int64_t ignore_index = ctx->saved_data["ignore_index"].toInt();
    const auto reduction = static_cast<Reduction>(ctx->saved_data["reduction"].toInt());
    const int64_t rows = logits.size(0);
    at::Tensor upstream = grad_outputs[0].to(row_lse.scalar_type());
    at::Tensor row_scale;
    switch (reduction) {
      case Reduction::none: row_scale = upstream.contiguous(); break;
      case Reduction::sum: row_scale = upstream.expand({rows}).contiguous(); break;
      case Reduction::mean: row_scale = (upstream / counted).expand({rows}).contiguous(); break;
    }
    at::Tensor grad = logits.is_cuda()
                          ? detail::cross_entropy_grad_cuda(logits, target, ignore_index, row_lse, row_scale)
                          : cross_entropy_grad_cpu(logits, target, ignore_index, row_lse, row_scale);
    return {grad, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

torch::Tensor fused_cross_entropy(const torch::Tensor& logits, const torch::Tensor& target,
                                  const torch::nn::functional::CrossEntropyFuncOptions& options) {
  const char* who = "cpprun::fused_cross_entropy: ";
  TORCH_CHECK(logits.defined() && target.defined(), who, "logits and target must be defined tensors");
  TORCH_CHECK(logits.dim() == 2, who, "logits must be [N, C] (rows, classes), got ", logits.sizes(),
              "; view a batch of sequences as logits.view({-1, C}) and its targets as .view({-1})");
  TORCH_CHECK(logits.size(1) > 0, who, "logits have no classes (shape ", logits.sizes(), ")");
  TORCH_CHECK(at::isFloatingType(logits.scalar_type()), who, "logits must be floating point, got ",
              logits.scalar_type());
  TORCH_CHECK(target.dim() == 1 && target.size(0) == logits.size(0), who, "target must be [N] with N = ",
              logits.size(0), " (one class index a row of logits), got ", target.sizes());
  TORCH_CHECK(target.scalar_type() == at::kLong, who, "target must hold class indices as int64 (kLong), got ",
              target.scalar_type(), at::isFloatingType(target.scalar_type())
                                        ? "; class probabilities as targets are F::cross_entropy's, not this"
                                        : "; convert it with .to(torch::kLong)");
  TORCH_CHECK(target.device() == logits.device(), who, "target is on ", target.device(), " but logits on ",
              logits.device());
  TORCH_CHECK(logits.device().is_cpu() || logits.is_cuda(), who, "logits on ", logits.device(),
              ": only the CPU and CUDA are supported");
  TORCH_CHECK(!options.weight().defined(), who,
              "class weights are not supported: use torch::nn::functional::cross_entropy for them");
  TORCH_CHECK(options.label_smoothing() == 0.0, who, "label smoothing (", options.label_smoothing(),
              ") is not supported: use torch::nn::functional::cross_entropy for it");
  TORCH_CHECK(!logits.is_cuda() || logits.size(0) <= int64_t{2147483647}, who, "at most 2^31 - 1 rows on CUDA, got ",
              logits.size(0));
  // The loss is computed as written here, in float32 or float64, whatever autocast is doing around it.
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  const at::Tensor rows_contiguous = logits.stride(1) == 1 ? logits : logits.contiguous();
  return FusedCrossEntropy::apply(rows_contiguous, target.contiguous(), options.ignore_index(),
                                  static_cast<int64_t>(reduction_of(options.reduction())));
}

bool fused_cross_entropy_available(const torch::Device& device, torch::ScalarType dtype, std::string* why_not) {
  std::string reason;
  if (!at::isFloatingType(dtype)) {
    reason = "logits of dtype " + std::string(c10::toString(dtype)) + " are not floating point";
  } else if (device.is_cuda()) {
    try {
      detail::cross_entropy_kernels_load(device, dtype);
    } catch (const c10::Error& error) {
      reason = error.what_without_backtrace();
    } catch (const std::exception& error) {
      reason = error.what();
    }
  } else if (!device.is_cpu()) {
    reason = "logits on " + device.str() + ": only the CPU and CUDA are supported";
  }
  if (why_not) *why_not = reason;
  return reason.empty();
}

}  // namespace cpprun
