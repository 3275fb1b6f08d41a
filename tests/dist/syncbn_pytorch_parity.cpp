// The C++ side of syncbn_pytorch_parity.sh: cpprun's SyncBatchNorm under its DDP trains what
// syncbn_pytorch_parity.py trains with PyTorch's, from DIR/init_MODEL.safetensors on
// DIR/batches_MODEL.safetensors (each rank's batch of its own size); rank 0 writes
// DIR/cpp_MODEL.safetensors: the state dict after training and the eval output.
//   cpprun --nproc_per_node=2 syncbn_pytorch_parity DIR cnn|seq
#include <torch/torch.h>

#include <cstdio>
#include <map>
#include <string>

#include "cpprun/cpprun.h"
#include "interop_files.h"

namespace {

constexpr int kSteps = 4;

// syncbn_pytorch_parity.py's net(NAME), the same.
torch::nn::Sequential net(const std::string& name) {
  namespace nn = torch::nn;
  nn::Sequential model;
  if (name == "cnn") {
    model = nn::Sequential(nn::Conv2d(nn::Conv2dOptions(1, 4, 3).padding(1).bias(false)), nn::BatchNorm2d(4),
                           nn::ReLU(), nn::Conv2d(nn::Conv2dOptions(4, 6, 3).padding(1).bias(false)),
                           nn::BatchNorm2d(nn::BatchNormOptions(6).momentum(std::nullopt)), nn::Flatten(),
                           nn::Linear(6 * 8 * 8, 4));
  } else {
    model = nn::Sequential(nn::Conv1d(nn::Conv1dOptions(3, 8, 3).padding(1)),
                           nn::BatchNorm1d(nn::BatchNormOptions(8).affine(false).momentum(0.3)), nn::Tanh(),
                           nn::Flatten(), nn::Linear(8 * 6, 10), nn::BatchNorm1d(10), nn::Tanh(), nn::Linear(10, 4));
  }
  return model;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 || (std::string(argv[2]) != "cnn" && std::string(argv[2]) != "seq")) {
    std::fprintf(stderr, "usage: cpprun --nproc_per_node=2 syncbn_pytorch_parity DIR cnn|seq\n");
    return 2;
  }
  const std::string dir = argv[1], name = argv[2];
  auto group = cpprun::init_process_group();
  // Built in float64 (Module::to(kDouble) would turn num_batches_tracked, an int64 buffer, to
  // float64 as well, where Python's .double() leaves it).
  torch::set_default_dtype(caffe2::TypeMeta::Make<double>());
  auto model = net(name);
  cpprun::load_state_dict(model, dir + "/init_" + name + ".safetensors");
  cpprun::convert_sync_batchnorm(model.ptr(), group);
  auto ddp = cpprun::DistributedDataParallel(model.ptr(), group);
  torch::optim::SGD opt(ddp->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  const auto batches = interop::read_tensors(dir + "/batches_" + name + ".safetensors");
  const std::string r = std::to_string(group.rank());
  for (int s = 0; s < kSteps; ++s) {
    opt.zero_grad();
    const std::string at = r + "_" + std::to_string(s);
    torch::nn::functional::cross_entropy(ddp->forward(batches.at("x" + at)), batches.at("y" + at)).backward();
    opt.step();
  }
  model->eval();
  torch::NoGradGuard no_grad;
  cpprun::detail::NamedTensors out = cpprun::detail::module_state(*model);
  out.emplace_back("eval_output", model->forward(batches.at("eval")));
  const std::string path = dir + "/cpp_" + name + ".safetensors";
  if (group.rank() == 0) interop::write_tensors(path, out);
  cpprun::barrier(group);
  return 0;
}
