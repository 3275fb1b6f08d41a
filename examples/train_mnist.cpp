// Trains a small CNN on MNIST with cpprun's DistributedDataParallel and DistributedSampler.
//
//   single process:  ./build/examples/train_mnist --data DIR
//   two ranks:       ./build/launcher/cpprun --nproc_per_node=2 ./build/examples/train_mnist --data DIR
//   fault tolerant:  ./build/launcher/cpprun --max_restarts=3 --nproc_per_node=2 ./build/examples/train_mnist --resume
//
// DIR holds MNIST's idx files (train-images-idx3-ubyte, ...). Without them a stand-in set of
// the same shape is generated, so the program runs anywhere. Each epoch, rank 0 writes a
// checkpoint (atomically); --resume continues from it, so a run restarted by cpprun after a
// worker died goes on where it was. At the end, rank 0 writes loss.csv and loss.svg.
// Options: --data DIR  --out DIR (default mnist_run)  --epochs N (3)  --batch B per rank (64)
//          --lr X (Adam, 1e-3)  --train-size N (all)  --resume
#include <cpprun/cpprun.h>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

namespace fs = std::filesystem;

struct Options {
  std::string data, out = "mnist_run";
  int epochs = 3, batch = 64;
  double lr = 1e-3;
  int64_t train_size = -1;
  bool resume = false;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&] {
      if (i + 1 >= argc) throw std::invalid_argument(flag + " needs a value");
      return std::string(argv[++i]);
    };
    if (flag == "--data") o.data = value();
    else if (flag == "--out") o.out = value();
    else if (flag == "--epochs") o.epochs = std::stoi(value());
    else if (flag == "--batch") o.batch = std::stoi(value());
    else if (flag == "--lr") o.lr = std::stod(value());
    else if (flag == "--train-size") o.train_size = std::stoll(value());
    else if (flag == "--resume") o.resume = true;
    else throw std::invalid_argument("unknown flag " + flag + " (see the comment at the top of train_mnist.cpp)");
  }
  return o;
}

struct Split {
  torch::Tensor images, labels;  // [N, 1, 28, 28] in [0, 1], [N]
};

// Stand-in for MNIST: ten smooth random "digit" templates; each example is one of them, moved by
// up to 3 pixels each way, under heavy noise: a 10-class task of MNIST's shape.
Split stand_in(int64_t n, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(20240);
  auto templates = torch::nn::functional::interpolate(torch::rand({10, 1, 7, 7}, gen),
      torch::nn::functional::InterpolateFuncOptions().size(std::vector<int64_t>{28, 28}).mode(torch::kBilinear).align_corners(false));
  auto data_gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto labels = torch::randint(0, 10, {n}, data_gen, torch::kLong);
  auto images = templates.index_select(0, labels);
  auto shifts = torch::randint(-3, 4, {n, 2}, data_gen, torch::kLong);
  for (int64_t dy = -3; dy <= 3; ++dy) {
    for (int64_t dx = -3; dx <= 3; ++dx) {
      auto picked = ((shifts.select(1, 0) == dy) & (shifts.select(1, 1) == dx)).nonzero().flatten();
      images.index_copy_(0, picked, images.index_select(0, picked).roll({dy, dx}, {2, 3}));
    }
  }
  images = (images + 0.5 * torch::randn(images.sizes(), data_gen)).clamp(0, 1);
  return {images, labels};
}

std::pair<Split, Split> load_data(const std::string& dir, int rank) {
  using torch::data::datasets::MNIST;
  if (!dir.empty() && fs::exists(fs::path(dir) / "train-images-idx3-ubyte")) {
    MNIST train(dir, MNIST::Mode::kTrain), test(dir, MNIST::Mode::kTest);
    return {{train.images(), train.targets()}, {test.images(), test.targets()}};
  }
  if (rank == 0) std::printf("no MNIST files in '%s': using a generated stand-in set of the same shape\n", dir.c_str());
  return {stand_in(12000, 1), stand_in(2000, 2)};
}

// One example per index, normalized as MNIST usually is.
struct ImageDataset : torch::data::datasets::Dataset<ImageDataset> {
  Split split;
  explicit ImageDataset(Split s) : split(std::move(s)) {}
  torch::data::Example<> get(size_t i) override { return {(split.images[i] - 0.1307) / 0.3081, split.labels[i]}; }
  torch::optional<size_t> size() const override { return split.labels.size(0); }
};

struct NetImpl : torch::nn::Module {
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  NetImpl() {
    conv1 = register_module("conv1", torch::nn::Conv2d(1, 16, 5));
    conv2 = register_module("conv2", torch::nn::Conv2d(16, 32, 5));
    fc1 = register_module("fc1", torch::nn::Linear(32 * 4 * 4, 64));
    fc2 = register_module("fc2", torch::nn::Linear(64, 10));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::max_pool2d(torch::relu(conv1(x)), 2);
    x = torch::max_pool2d(torch::relu(conv2(x)), 2);
    return fc2(torch::relu(fc1(x.flatten(1))));
  }
};
TORCH_MODULE(Net);

// Accuracy on the test set: each rank scores every world-th example; the counts are summed.
double evaluate(Net& net, const Split& test, const cpprun::ProcessGroup& group) {
  torch::NoGradGuard no_grad;
  net->eval();
  auto mine = torch::arange(group.rank(), test.labels.size(0), group.size());
  auto logits = net->forward((test.images.index_select(0, mine) - 0.1307) / 0.3081);
  auto counts = torch::stack({(logits.argmax(1) == test.labels.index_select(0, mine)).sum(), torch::tensor(mine.numel())})
                    .to(torch::kDouble);
  cpprun::all_reduce(group, counts);
  net->train();
  return counts[0].item<double>() / counts[1].item<double>();
}

void write_svg(const fs::path& file, const std::vector<double>& losses) {
  const double w = 640, h = 360, top = *std::max_element(losses.begin(), losses.end());
  std::ofstream svg(file);
  svg << "<svg xmlns='http://www.w3.org/2000/svg' width='" << w << "' height='" << h << "'>\n"
      << "<rect width='100%' height='100%' fill='white'/>\n<text x='10' y='20' font-family='sans-serif'>"
      << "train_mnist: loss per step (max " << top << ")</text>\n<polyline fill='none' stroke='steelblue' points='";
  for (size_t i = 0; i < losses.size(); ++i) {
    svg << 10 + (w - 20) * i / std::max<size_t>(1, losses.size() - 1) << ',' << h - 10 - (h - 40) * losses[i] / top << ' ';
  }
  svg << "'/>\n<line x1='10' y1='" << h - 10 << "' x2='" << w - 10 << "' y2='" << h - 10 << "' stroke='gray'/>\n"
      << "<text x='12' y='" << h - 14 << "' font-family='sans-serif' font-size='11'>0</text>\n<text x='" << w - 110
      << "' y='" << h - 14 << "' font-family='sans-serif' font-size='11'>" << losses.size() << " steps</text>\n</svg>\n";
}

int main(int argc, char** argv) {
  const Options opt = parse(argc, argv);
  auto group = cpprun::init_process_group();
  const int rank = group.rank();
  auto [train, test] = load_data(opt.data, rank);
  if (opt.train_size > 0 && opt.train_size < train.labels.size(0)) {
    train = {train.images.narrow(0, 0, opt.train_size), train.labels.narrow(0, 0, opt.train_size)};
  }
  fs::create_directories(opt.out);
  const fs::path checkpoint = fs::path(opt.out) / "checkpoint.pt";

  torch::manual_seed(0);
  Net net;
  torch::optim::Adam optimizer(net->parameters(), torch::optim::AdamOptions(opt.lr));
  int start_epoch = 0;
  std::vector<double> losses;  // global loss per step, kept in the checkpoint for the plot
  if (opt.resume && fs::exists(checkpoint)) {
    torch::serialize::InputArchive archive;
    archive.load_from(checkpoint.string());
    net->load(archive);
    optimizer.load(archive);
    torch::Tensor saved_epoch, saved_losses;
    archive.read("epoch", saved_epoch);
    archive.read("losses", saved_losses);
    start_epoch = saved_epoch.item<int>() + 1;
    losses.assign(saved_losses.data_ptr<double>(), saved_losses.data_ptr<double>() + saved_losses.numel());
    if (rank == 0) std::printf("resuming after epoch %d from %s\n", start_epoch, checkpoint.c_str());
  }
  auto model = cpprun::DistributedDataParallel(net, group);

  cpprun::DistributedSampler sampler(train.labels.size(0), group);
  auto loader = torch::data::make_data_loader(ImageDataset(train).map(torch::data::transforms::Stack<>()), sampler,
                                              torch::data::DataLoaderOptions(opt.batch));
  const int64_t steps_per_epoch = (sampler.size() + opt.batch - 1) / opt.batch;
  const bool terminal = isatty(STDOUT_FILENO);
  auto started = std::chrono::steady_clock::now();
  int64_t steps_done = 0;

  for (int epoch = start_epoch; epoch < opt.epochs; ++epoch) {
    sampler.set_epoch(epoch);
    int64_t step = 0;
    for (auto& batch : *loader) {
      optimizer.zero_grad();
      auto loss = torch::nn::functional::cross_entropy(model->forward(batch.data), batch.target);
      loss.backward();
      optimizer.step();

      auto global_loss = loss.detach().clone();
      cpprun::all_reduce(group, global_loss, cpprun::ReduceOp::kAvg);
      losses.push_back(global_loss.item<double>());
      ++step, ++steps_done;
      if (rank == 0 && (terminal || step % 50 == 0 || step == steps_per_epoch)) {
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
        const double remaining = ((opt.epochs - epoch - 1) * steps_per_epoch + steps_per_epoch - step) * seconds / steps_done;
        std::printf("%sepoch %d/%d  step %3lld/%lld  loss %.4f  %.0f samples/s  ETA %.0f s%s", terminal ? "\r" : "",
                    epoch + 1, opt.epochs, static_cast<long long>(step), static_cast<long long>(steps_per_epoch),
                    losses.back(), steps_done * opt.batch * group.size() / seconds, remaining, terminal ? "" : "\n");
        std::fflush(stdout);
      }
    }
    const double accuracy = evaluate(net, test, group);
    if (rank == 0) {
      std::printf("%sepoch %d/%d  test accuracy %.2f%%\n", terminal ? "\n" : "", epoch + 1, opt.epochs, 100 * accuracy);
      torch::serialize::OutputArchive archive;  // written to a temporary name, then renamed
      net->save(archive);
      optimizer.save(archive);
      archive.write("epoch", torch::tensor(epoch));
      archive.write("losses", torch::tensor(losses, torch::kDouble));
      const fs::path temporary = checkpoint.string() + ".tmp";
      archive.save_to(temporary.string());
      fs::rename(temporary, checkpoint);
    }
  }

  const double accuracy = evaluate(net, test, group);  // collective: every rank calls it
  if (rank == 0 && !losses.empty()) {
    std::ofstream csv(fs::path(opt.out) / "loss.csv");
    csv << "step,loss\n";
    for (size_t i = 0; i < losses.size(); ++i) csv << i + 1 << ',' << losses[i] << '\n';
    write_svg(fs::path(opt.out) / "loss.svg", losses);
    std::printf("final test accuracy %.2f%%; loss curve in %s/loss.csv and loss.svg\n", 100 * accuracy, opt.out.c_str());
  }
}
