// The C++ side of grad_scaler_interop.sh: cpprun::GradScaler in one process through the steps
// grad_scaler_interop.py takes with torch.amp.GradScaler (an inf and a NaN gradient, unscale_
// and clipping before a step); writes DIR/cpp.safetensors: the scale after each update and the
// parameters after each step.
//   grad_scaler_interop DIR
#include <torch/torch.h>

#include <cstdio>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "checkpoint/state_dict.h"
#include "cpprun/atomic_file.h"
#include "cpprun/clip_grad_norm.h"
#include "cpprun/grad_scaler.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: grad_scaler_interop DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  constexpr int kSteps = 12;
  const std::set<int> inf_at{3, 7}, nan_at{5}, clip_at{9};  // grad_scaler_interop.py's, the same
  auto w = torch::tensor({0.5f, -1.0f, 2.0f, 0.25f}).requires_grad_();
  torch::optim::SGD opt({w}, 0.1);
  cpprun::GradScaler scaler(
      cpprun::GradScalerOptions().init_scale(8).growth_factor(2).backoff_factor(0.5).growth_interval(2));
  std::vector<double> scales;
  std::vector<torch::Tensor> params;
  for (int s = 0; s < kSteps; ++s) {
    opt.zero_grad();
    const auto x = torch::arange(4, torch::kFloat) + s;
    scaler.scale((w * x).sum().pow(2) / 100).backward();
    if (inf_at.count(s)) w.mutable_grad()[0] = std::numeric_limits<float>::infinity();
    if (nan_at.count(s)) w.mutable_grad()[1] = std::numeric_limits<float>::quiet_NaN();
    if (clip_at.count(s)) {
      scaler.unscale_(opt);
      cpprun::clip_grad_norm_(std::vector<torch::Tensor>{w}, 0.5);
    }
    scaler.step(opt);
    scaler.update();
    scales.push_back(scaler.get_scale());
    params.push_back(w.detach().clone());
  }
  const std::string path = dir + "/cpp.safetensors";
  cpprun::detail::NamedTensors out{{"scales", torch::tensor(scales, torch::kDouble)}, {"params", torch::stack(params)}};
  cpprun::write_file_atomically(path, cpprun::detail::encode_state_dict(out, path));
  return 0;
}
