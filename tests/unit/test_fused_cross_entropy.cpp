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
  CHECK_THAT(error_text_of([&] {
               cpprun::fused_cross_entropy(logits, target, F::CrossEntropyFuncOptions().weight(torch::ones(6)));
             }),
             Catch::Contains("class weights are not supported"));
  CHECK_THAT(error_text_of([&] {
               cpprun::fused_cross_entropy(logits, target, F::CrossEntropyFuncOptions().label_smoothing(0.1));
             }),
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
  CHECK_THAT(error_text_of([&] { cpprun::detail::nvrtc_target(90, {}); }),
             Catch::Contains("lists no GPU architecture"));
}

TEST_CASE("NVRTC is found under the names CUDA, the pip wheels and LibTorch's zip give it", "[fused_cross_entropy]") {
  using cpprun::detail::is_nvrtc_library;
  for (const char* name : {"libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12.8.93", "libnvrtc-672ee683.so.11.2",
                           "libnvrtc-d833c4f3.so.12"}) {
    INFO(name);
    CHECK(is_nvrtc_library(name));
  }
  for (const char* name :
       {"libnvrtc-builtins.so.13.0", "libnvrtc-builtins-2dc4bf68.so.11.8", "libnvrtc.alt.so.12", "libnvrtc_static.a",
        "libnvrtc-builtins_static.a", "libnvrtc.a", "libnvrtc-.so.12", "libnvrtc-ab.cd.so.12", "libnvrtc-672ee683.sox",
        "libnvrtc", "libcudart.so.13", "nvrtc.so"}) {
    INFO(name);
    CHECK_FALSE(is_nvrtc_library(name));
  }
  // The CUDA runtime's major version first, then the newest, whatever the folder; the builtins and
  // other libraries dropped; a name without a version last; equal ranks keep their order.
  const std::vector<std::string> paths{"/w/torch/lib/libtorch_cuda.so",
                                       "/w/nvidia/cuda_nvrtc/lib/libnvrtc.so.12",
                                       "/usr/lib/libnvrtc.so",
                                       "/w/nvidia/cu13/lib/libnvrtc-builtins.so.13.0",
                                       "/w/nvidia/cu13/lib/libnvrtc.so.13",
                                       "/z/libtorch/lib/libnvrtc-d833c4f3.so.12"};
  using cpprun::detail::nvrtc_libraries_in_order;
  CHECK(nvrtc_libraries_in_order(paths, -1) ==
        std::vector<std::string>{"/w/nvidia/cu13/lib/libnvrtc.so.13", "/w/nvidia/cuda_nvrtc/lib/libnvrtc.so.12",
                                 "/z/libtorch/lib/libnvrtc-d833c4f3.so.12", "/usr/lib/libnvrtc.so"});
  CHECK(nvrtc_libraries_in_order(paths, 12) ==
        std::vector<std::string>{"/w/nvidia/cuda_nvrtc/lib/libnvrtc.so.12", "/z/libtorch/lib/libnvrtc-d833c4f3.so.12",
                                 "/w/nvidia/cu13/lib/libnvrtc.so.13", "/usr/lib/libnvrtc.so"});
  CHECK(nvrtc_libraries_in_order(paths, 11).front() == "/w/nvidia/cu13/lib/libnvrtc.so.13");  // none of 11: newest
  // The runtime's version, from the pip wheel's and the zip's names.
  using cpprun::detail::cuda_runtime_major;
  CHECK(cuda_runtime_major({"/w/torch/lib/libtorch_cuda.so", "/w/nvidia/cu13/lib/libcudart.so.13"}) == 13);
  CHECK(cuda_runtime_major({"/z/libtorch/lib/libcudart-9335f6a2.so.12"}) == 12);
  CHECK(cuda_runtime_major({"/usr/lib/libcudart_static.a", "/w/lib/libcudart.so"}) == -1);
  CHECK(cuda_runtime_major({}) == -1);
}

TEST_CASE("fused_cross_entropy_available says what stands in the way", "[fused_cross_entropy]") {
  std::string why_not = "(unset)";
  CHECK(cpprun::fused_cross_entropy_available(torch::kCPU, torch::kBFloat16, &why_not));
  CHECK(why_not.empty());
  CHECK(cpprun::fused_cross_entropy_available(torch::kCPU, torch::kDouble));
  CHECK_FALSE(cpprun::fused_cross_entropy_available(torch::kCPU, torch::kLong, &why_not));
  CHECK(why_not == "logits of dtype Long are not floating point");
  CHECK_FALSE(cpprun::fused_cross_entropy_available(torch::Device("meta"), torch::kFloat, &why_not));
  CHECK_THAT(why_not, Catch::Contains("logits on meta: only the CPU and CUDA are supported"));
#ifdef CPPRUN_WITH_CUDA
  // Refused before the device is touched, so the same with or without a GPU.
  CHECK_FALSE(cpprun::fused_cross_entropy_available(torch::Device("cuda:0"), torch::kFloat8_e4m3fn, &why_not));
  CHECK_THAT(why_not, Catch::Contains("no CUDA kernel for logits of dtype Float8_e4m3fn"));
  // Without a GPU the reason is the runtime's. With one the kernels compile and load where NVRTC
  // is found, which depends on how LibTorch was installed: the gpu label's
  // gpu.fused_cross_entropy requires it; here it is only reported.
  const bool available = cpprun::fused_cross_entropy_available(torch::Device("cuda:0"), torch::kBFloat16, &why_not);
  if (!torch::cuda::is_available()) {
    INFO("why not: " << why_not);
    CHECK_FALSE(available);
    CHECK_FALSE(why_not.empty());
  } else if (!available) {
    WARN("fused_cross_entropy cannot run on this GPU: " << why_not);
  }
#endif
}

#ifdef CPPRUN_WITH_CUDA
// CI's LibTorch has CUDA, so this runs there: NVRTC is in the process (libtorch_cuda.so needs it).
TEST_CASE("the CUDA kernels' source compiles with NVRTC for every dtype", "[fused_cross_entropy]") {
  const auto archs = cpprun::detail::nvrtc_supported_archs();
  REQUIRE_FALSE(archs.empty());
  for (int arch : {80, 90}) {
    const auto target = cpprun::detail::nvrtc_target(arch, archs);
    for (auto dtype : {torch::kFloat, torch::kDouble, torch::kBFloat16, torch::kHalf}) {
      INFO("arch " << arch << " dtype " << dtype << " " << target.arch_option);
      const std::string binary =
          cpprun::detail::nvrtc_compile(cpprun::detail::cross_entropy_kernel_source(), "cpprun_cross_entropy.cu",
                                        target, cpprun::detail::cross_entropy_compile_options(dtype));
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
