// train.cpp: a small network learns whether a point's coordinates sum above zero, on every rank.
// (examples/readme_train.cpp is this program; the tests build it and run it on 2 ranks.)
#include <cpprun/cpprun.h>
#include <torch/torch.h>

struct Net : torch::nn::Module {
  torch::nn::Linear fc1{register_module("fc1", torch::nn::Linear(16, 64))};
  torch::nn::Linear fc2{register_module("fc2", torch::nn::Linear(64, 2))};
  torch::Tensor forward(torch::Tensor x) { return fc2(torch::relu(fc1(x))); }
};

struct Points : torch::data::datasets::Dataset<Points> {  // 4096 random points, labelled
  torch::Tensor x = torch::randn({4096, 16}), y = (x.sum(1) > 0).to(torch::kLong);
  torch::data::Example<> get(size_t i) override { return {x[i], y[i]}; }
  torch::optional<size_t> size() const override { return x.size(0); }
};

int main() {
  auto group = cpprun::init_process_group();            // RANK, WORLD_SIZE, ... as cpprun set them
  torch::manual_seed(0);                                // the same points on every rank
  auto dataset = Points().map(torch::data::transforms::Stack<>());
  cpprun::DistributedSampler sampler(dataset.size().value(), group);   // this rank's share
  auto loader = torch::data::make_data_loader(std::move(dataset), sampler, 64);
  auto model = cpprun::DistributedDataParallel(std::make_shared<Net>(), group);  // rank 0's weights
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  for (int epoch = 0; epoch < 5; ++epoch) {
    sampler.set_epoch(epoch);                           // a new shuffle each epoch, as PyTorch's
    torch::Tensor loss;
    for (auto& batch : *loader) {
      opt.zero_grad();
      loss = torch::nn::functional::cross_entropy(model->forward(batch.data), batch.target);
      loss.backward();                                  // gradients averaged over the ranks here
      opt.step();
    }
    if (group.rank() == 0) std::printf("epoch %d  loss %.4f\n", epoch, loss.item<float>());
  }
}
