// cpprun::fused_cross_entropy against what train_gpt's --loss aten computes,
// F::cross_entropy(logits.to(float32 or float64), target), on DEVICE: the loss and the gradient
// with respect to the logits, for float64, float32, bfloat16 and float16 logits, rows of 3 to
// 50,304 classes (GPT-2's padded vocabulary, whose rows the CUDA kernels read 16 bytes at a time,
// and 50,257, whose rows they cannot), every reduction, ignored rows, a view whose rows are not
// contiguous with each other, every row ignored, and a target out of range. Exit 1 with a FAIL line
// per mismatch; 77 (skipped) for --device cuda where there is no GPU.
//
// float64 decides the logic (1e-12); the others are computed in float32 on both sides from the
// same values, and the reduced-precision gradients may round one unit in the last place apart.
// With --device cuda it then times both at GPT-2's shape (16 x 1024 rows, bf16): printed, never
// asserted.
//
//   usage: fused_cross_entropy_check --device cpu|cuda
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "cpprun/fused_cross_entropy.h"

namespace F = torch::nn::functional;

namespace {

int failures = 0;

void expect(bool ok, const std::string& what) {
  if (ok) return;
  ++failures;
  std::cout << "FAIL: " << what << std::endl;
}

torch::Dtype accumulate_of(torch::Dtype dtype) { return dtype == torch::kDouble ? torch::kDouble : torch::kFloat; }

// The smallest t with |a - b| <= t * (|b| + absolute_per_relative * max |b|) wherever b is
// finite: the relative tolerance these values needed, with an absolute one in that proportion
// (for elements that are small differences of larger ones, a target's softmax - 1, whose rounding
// is the larger ones'). Infinite where a NaN of one is not a NaN of the other, where a is infinite
// and b finite, or where values differ and the bound is 0.
double needed(const torch::Tensor& a, const torch::Tensor& b, double absolute_per_relative) {
  auto x = a.to(torch::kDouble).cpu(), y = b.to(torch::kDouble).cpu();
  if (!torch::equal(torch::isnan(x), torch::isnan(y))) return INFINITY;
  auto finite = torch::isfinite(y);
  if (!finite.any().item<bool>()) return 0.0;
  const double largest = y.abs().masked_select(finite).max().item<double>();
  auto difference = (x - y).abs().masked_select(finite);
  auto scale = (y.abs() + absolute_per_relative * largest).masked_select(finite);
  return torch::where(difference == 0, torch::zeros_like(difference), difference / scale).max().item<double>();
}

// Per dtype, the most any case needed (loss, gradient), printed beside what is allowed: the
// bounds below were set by reasoning; these are what they are measured against.
std::map<std::string, std::pair<double, double>> most_needed;

// Loss and gradient tolerances: float64 decides the logic; float32 rounds differently in the
// sums; bf16 and fp16 gradients may differ by one unit in the last place (2^-7, 2^-10 relative).
struct Tolerance {
  double loss, grad_relative, grad_absolute;
};

Tolerance tolerance_of(torch::Dtype dtype) {
  if (dtype == torch::kDouble) return {1e-12, 1e-12, 1e-14};
  if (dtype == torch::kFloat) return {2e-6, 2e-5, 1e-6};
  if (dtype == torch::kBFloat16) return {2e-6, 1.0 / 128, 1e-6};
  return {2e-6, 1.0 / 1024, 1e-6};
}

std::string reduction_name(int which) { return which == 0 ? "none" : which == 1 ? "mean" : "sum"; }

F::CrossEntropyFuncOptions options_of(int which) {
  F::CrossEntropyFuncOptions options;
  if (which == 0) options.reduction(torch::kNone);
  if (which == 2) options.reduction(torch::kSum);
  return options;
}

void compare(torch::Device device, torch::Dtype dtype, int64_t rows, int64_t columns, int which, bool strided) {
  const std::string name = std::string(c10::toString(dtype)) + " " + std::to_string(rows) + "x" +
                           std::to_string(columns) + (strided ? " (a column slice)" : "") + " reduction " +
                           reduction_name(which);
  torch::manual_seed(rows * 131 + columns + which);
  // Logits of a trained model's spread; a column slice leaves rows that do not follow each other.
  auto wide = (torch::randn({rows, columns + (strided ? 5 : 0)}, torch::kDouble) * 3).to(device, dtype);
  auto target = torch::randint(0, columns, {rows}, torch::TensorOptions(torch::kLong)).to(device);
  if (rows > 2) target[1] = -100;  // ignored
  auto upstream = which == 0 ? torch::randn({rows}, torch::kDouble).to(device, accumulate_of(dtype))
                             : torch::full({}, 1.7, torch::TensorOptions(accumulate_of(dtype)).device(device));
  auto view = [&](const torch::Tensor& t) { return strided ? t.narrow(1, 2, columns) : t; };

  auto logits = wide.clone().requires_grad_();
  auto fused = cpprun::fused_cross_entropy(view(logits), target, options_of(which));
  (fused * upstream).sum().backward();

  auto reference_logits = wide.clone().requires_grad_();
  auto reference = F::cross_entropy(view(reference_logits).to(accumulate_of(dtype)), target, options_of(which));
  (reference * upstream).sum().backward();

  const auto tol = tolerance_of(dtype);
  expect(fused.scalar_type() == accumulate_of(dtype), name + ": the loss is " + c10::toString(fused.scalar_type()));
  expect(fused.sizes() == reference.sizes(), name + ": the loss's shape differs");
  const double loss_needed = needed(fused, reference, 1.0);  // the loss's absolute bound is its relative one
  expect(loss_needed <= tol.loss, name + ": the loss needed a relative tolerance of " + c10::str(loss_needed) +
                                      ", beyond the " + c10::str(tol.loss) + " allowed");
  expect(logits.grad().scalar_type() == dtype, name + ": the gradient's dtype is not the logits'");
  const double grad_needed = needed(logits.grad(), reference_logits.grad(), tol.grad_absolute / tol.grad_relative);
  expect(grad_needed <= tol.grad_relative, name + ": the gradient needed a relative tolerance of " +
                                               c10::str(grad_needed) + ", beyond the " +
                                               c10::str(tol.grad_relative) + " allowed");
  auto& most = most_needed[c10::toString(dtype)];
  most.first = std::max(most.first, loss_needed);
  most.second = std::max(most.second, grad_needed);
  if (rows > 2) {
    expect(logits.grad()[1].abs().max().item<double>() == 0, name + ": the ignored row has a gradient");
  }
}

void edge_cases(torch::Device device) {
  // Every row ignored: a NaN mean (PyTorch's too) and no gradient.
  auto logits = torch::randn({4, 10}, torch::TensorOptions(torch::kFloat).device(device)).requires_grad_();
  auto target = torch::full({4}, -1, torch::TensorOptions(torch::kLong).device(device));
  auto loss = cpprun::fused_cross_entropy(logits, target, F::CrossEntropyFuncOptions().ignore_index(-1));
  expect(std::isnan(loss.item<double>()), "every row ignored: the mean is not NaN");
  loss.backward();
  expect(logits.grad().abs().max().item<double>() == 0, "every row ignored: the logits have a gradient");
  // A target outside the classes: an error on the CPU, a NaN on CUDA (no host wait for a check).
  auto bad = torch::tensor({0, 10, 2, 3}, torch::TensorOptions(torch::kLong)).to(device);
  if (device.is_cpu()) {
    bool refused = false;
    try {
      cpprun::fused_cross_entropy(logits, bad);
    } catch (const c10::Error& e) {
      refused = std::string(e.what()).find("target 10 of row 1") != std::string::npos;
    }
    expect(refused, "a target out of range on the CPU is not refused naming it");
  } else {
    auto rows = cpprun::fused_cross_entropy(logits.detach(), bad, F::CrossEntropyFuncOptions().reduction(torch::kNone));
    expect(std::isnan(rows[1].item<double>()) && !std::isnan(rows[0].item<double>()),
           "a target out of range on CUDA does not make its row's loss (alone) NaN");
  }
}

double seconds_per_step(const std::function<void()>& step) {
  for (int i = 0; i < 2; ++i) step();
  torch::cuda::synchronize();
  const auto start = std::chrono::steady_clock::now();
  const int steps = 10;
  for (int i = 0; i < steps; ++i) step();
  torch::cuda::synchronize();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / steps;
}

// GPT-2's loss at batch 16 x 1024, bf16 logits: forward and backward of each.
void time_gpt2_shape(torch::Device device) {
  auto logits = (torch::randn({16 * 1024, 50304}, torch::TensorOptions(torch::kBFloat16).device(device)) * 3)
                    .requires_grad_();
  auto target = torch::randint(0, 50304, {16 * 1024}, torch::TensorOptions(torch::kLong).device(device));
  auto fused_step = [&] {
    logits.mutable_grad() = torch::Tensor();
    cpprun::fused_cross_entropy(logits, target).backward();
  };
  auto aten_step = [&] {
    logits.mutable_grad() = torch::Tensor();
    F::cross_entropy(logits.to(torch::kFloat), target).backward();
  };
  const double fused = seconds_per_step(fused_step), aten = seconds_per_step(aten_step);
  std::printf("timing (16384 x 50304 bf16, forward + backward, median of nothing: the mean of 10): "
              "fused_cross_entropy %.3f ms, F::cross_entropy(logits.float()) %.3f ms, ratio %.2fx\n",
              fused * 1e3, aten * 1e3, aten / fused);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string device_name = argc == 3 && std::string(argv[1]) == "--device" ? argv[2] : "";
  if (device_name != "cpu" && device_name != "cuda") {
    std::cerr << "usage: " << argv[0] << " --device cpu|cuda\n";
    return 2;
  }
  if (device_name == "cuda" && !torch::cuda::is_available()) {
    std::cout << "SKIP: no CUDA device (torch::cuda::is_available() is false)\n";
    return 77;
  }
  const torch::Device device(device_name == "cuda" ? torch::kCUDA : torch::kCPU);
  int cases = 0;
  for (auto dtype : {torch::kDouble, torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    for (auto [rows, columns] : std::vector<std::pair<int64_t, int64_t>>{{5, 3}, {37, 117}, {24, 50304}, {9, 50257}}) {
      for (int which = 0; which < 3; ++which) {
        compare(device, dtype, rows, columns, which, false);
        ++cases;
      }
    }
    compare(device, dtype, 37, 120, 1, true);
    ++cases;
  }
  edge_cases(device);
  for (auto dtype : {torch::kDouble, torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    const auto& [loss, grad] = most_needed[c10::toString(dtype)];
    const auto tol = tolerance_of(dtype);
    std::printf("measured on %s, %s: the loss needed %.3g relative (%.3g allowed), the gradient %.3g (%.3g allowed)\n",
                device_name.c_str(), c10::toString(dtype), loss, tol.loss, grad, tol.grad_relative);
  }
  if (device.is_cuda() && failures == 0) time_gpt2_shape(device);
  if (failures) {
    std::cout << "fused_cross_entropy_check: " << failures << " failure(s) on " << device_name << "\n";
    return 1;
  }
  std::cout << "fused_cross_entropy_check: ok, " << cases << " cases and the edge cases on " << device_name << "\n";
  return 0;
}
