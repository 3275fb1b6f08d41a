// cpprun::fused_cross_entropy's refusals, NVRTC's choice of what to compile for, and the CUDA
// kernels' source compiled by NVRTC for each dtype (NVRTC is a compiler: it needs no GPU, so
// every CI run compiles what a GPU would run). The numbers against F::cross_entropy are
// tests/gpu/fused_cross_entropy_check.cpp's, on the CPU here and on CUDA in the gpu label.
#include "catch.h"
#include <torch/torch.h>

#include <ATen/autocast_mode.h>

#include <functional>
#include <string>
#include <vector>

#include "error_text.h"
#include "cpprun/fused_cross_entropy.h"
#include "support/runtime_kernels.h"
#include "training/cross_entropy_rows.h"

namespace F = torch::nn::functional;

TEST_CASE("fused_cross_entropy refuses what it does not compute, naming the fix", "[fused_cross_entropy]") {
  auto logits = torch::randn({4, 6});
  auto target = torch::tensor({0, 1, 2, 5}, torch::kLong);
  CHECK_THAT(error_text_of([&] { cpprun::fused_cross_entropy(logits.view({2, 2, 6}), target); }),
             Catch::Contains("logits must be [N, C]") && Catch::Contains("view({-1, C})"));
  CHECK_THAT(error_text_of([&] { cpprun::fused_cross_entropy(logits, target.to(torch::kInt)); }),
             Catch::Contains("int64 (kLong), got Int") && Catch::Contains(".to(torch::kLong)"));
  CHECK_THAT(error_text_of([&] { cpprun::fused_cross_entropy(logits, torch::rand({4, 6})); }),
             Catch::Contains("target must be [N] with N = 4"));
  CHECK_THAT(error_text_of([&] { cpprun::fused_cross_entropy(logits, target.to(torch::kFloat)); }),
             Catch::Contains("class probabilities"));
  CHECK_THAT(error_text_of([&] { cpprun::fused_cross_entropy(logits, target.narrow(0, 0, 3)); }),
             Catch::Contains("target must be [N] with N = 4"));
  CHECK_THAT(error_text_of([&] { cpprun::fused_cross_entropy(logits, target, F::CrossEntropyFuncOptions().weight(torch::ones(6))); }),
             Catch::Contains("class weights are not supported"));
  CHECK_THAT(error_text_of([&] { cpprun::fused_cross_entropy(logits, target, F::CrossEntropyFuncOptions().label_smoothing(0.1)); }),
             Catch::Contains("label smoothing (0.1) is not supported"));
  CHECK_THAT(error_text_of([&] { cpprun::fused_cross_entropy(torch::randn({4, 0}), target); }),
             Catch::Contains("no classes"));
  CHECK_THAT(error_text_of([&] { cpprun::fused_cross_entropy(logits.to(torch::kLong), target); }),
             Catch::Contains("must be floating point"));
}

TEST_CASE("fused_cross_entropy's loss is float32 for reduced-precision logits, its gradient in theirs",
          "[fused_cross_entropy]") {
  torch::manual_seed(3);
  auto logits = torch::randn({8, 33}).to(torch::kBFloat16).requires_grad_();
  auto target = torch::randint(0, 33, {8}, torch::kLong);
  auto loss = cpprun::fused_cross_entropy(logits, target);
  CHECK(loss.scalar_type() == torch::kFloat);
  loss.backward();
  CHECK(logits.grad().scalar_type() == torch::kBFloat16);
  // Autocast around it changes nothing: the loss is computed as written.
  at::autocast::set_autocast_enabled(at::kCPU, true);
  auto under_autocast = cpprun::fused_cross_entropy(logits, target);
  at::autocast::set_autocast_enabled(at::kCPU, false);
  CHECK(under_autocast.item<double>() == loss.item<double>());
}

TEST_CASE("NVRTC compiles for the device's own architecture when it knows it, else PTX it can load",
          "[fused_cross_entropy]") {
  const std::vector<int> known{75, 80, 86, 89, 90, 100, 120};
  auto own = cpprun::detail::nvrtc_target(90, known);
  CHECK(own.arch_option == "--gpu-architecture=sm_90");
  CHECK(own.binary);
  auto newer = cpprun::detail::nvrtc_target(130, known);  // a device newer than this NVRTC
  CHECK(newer.arch_option == "--gpu-architecture=compute_120");
  CHECK_FALSE(newer.binary);
  auto between = cpprun::detail::nvrtc_target(87, known);  // not listed, inside the range
  CHECK(between.arch_option == "--gpu-architecture=compute_86");
  CHECK_FALSE(between.binary);
  CHECK_THAT(error_text_of([&] { cpprun::detail::nvrtc_target(61, known); }),
             Catch::Contains("6.1 is older than any this NVRTC compiles for (7.5 to 12.0)"));
  CHECK_THAT(error_text_of([&] { cpprun::detail::nvrtc_target(90, {}); }), Catch::Contains("lists no GPU architecture"));
}

#ifdef CPPRUN_WITH_CUDA
// CI's LibTorch has CUDA, so this runs there: NVRTC is in the process (libtorch_cuda.so needs it).
TEST_CASE("the CUDA kernels' source compiles with NVRTC for every dtype", "[fused_cross_entropy]") {
  const auto archs = cpprun::detail::nvrtc_supported_archs();
  REQUIRE_FALSE(archs.empty());
  for (int arch : {80, 90}) {
    const auto target = cpprun::detail::nvrtc_target(arch, archs);
    for (int dtype = 0; dtype < 4; ++dtype) {
      INFO("arch " << arch << " dtype " << dtype << " " << target.arch_option);
      const std::string binary =
          cpprun::detail::nvrtc_compile(cpprun::detail::cross_entropy_kernel_source(), "cpprun_cross_entropy.cu", target,
                                        {"--std=c++17", "-DCE_DTYPE=" + std::to_string(dtype)});
      CHECK(binary.find(cpprun::detail::kCrossEntropyForwardKernel) != std::string::npos);
      CHECK(binary.find(cpprun::detail::kCrossEntropyBackwardKernel) != std::string::npos);
    }
  }
  // A source that does not compile is refused with NVRTC's log.
  const auto target = cpprun::detail::nvrtc_target(90, archs);
  CHECK_THAT(error_text_of([&] {
               cpprun::detail::nvrtc_compile(cpprun::detail::cross_entropy_kernel_source(), "cpprun_cross_entropy.cu",
                                             target, {"--std=c++17", "-DCE_DTYPE=7"});
             }),
             Catch::Contains("could not compile cpprun_cross_entropy.cu") && Catch::Contains("CE_DTYPE must be"));
}
#endif
