// Trains a small CNN on MNIST with cpprun's DistributedDataParallel and DistributedSampler.
//
//   single process:  ./build/examples/train_mnist --data DIR
//   two ranks:       ./build/launcher/cpprun --nproc_per_node=2 ./build/examples/train_mnist --data DIR
//   fault tolerant:  ./build/launcher/cpprun --max_restarts=3 --nproc_per_node=2 ./build/examples/train_mnist --resume
//   options:         ./build/examples/train_mnist --help
//
// DIR holds MNIST's idx files (train-images-idx3-ubyte, ...), which are checked as they are read:
// a truncated or foreign file is an error naming it, never training on garbage. Without --data a
// stand-in set of the same shape is generated, so the program runs anywhere. After each epoch,
// rank 0 writes a checkpoint, a directory OUT/checkpoint_epochE/ of files PyTorch reads
// (model.safetensors, optimizer.safetensors by parameter name, trainer.json with the epoch and
// the losses; each file checksummed, the directory renamed into place once whole), written in
// the background while the next epoch trains (cpprun::save_async), and keeps the newest few;
// --resume continues from the newest one that loads, so a run restarted by cpprun after a worker
// died goes on where it was. Checkpoints of earlier versions (checkpoint_epochE.pt,
// a TorchScript archive) still load, with a notice. At the end, rank 0 writes loss.csv and loss.svg. Every error
// (a bad option, a missing or damaged file) ends with a message and exit code 1, and under cpprun
// in the failure summary (cpprun::record).
#include <cpprun/cpprun.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <string>

#include "flag_value.h"
#include "../support/file_read.h"  // MNIST's files read whole, refusing FIFOs and devices
#include "../support/safetensors.h"  // the model file's save id, against trainer.json's
#include "../support/safetensors_index.h"  // kSaveIdKey

namespace fs = std::filesystem;

constexpr const char* kUsage = R"(usage: train_mnist [options]
  --data DIR              MNIST's four idx files (train-images-idx3-ubyte, train-labels-idx1-ubyte,
                          t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte); default: a generated stand-in
  --out DIR               checkpoints, loss.csv and loss.svg (default mnist_run)
  --epochs N              (default 3)
  --batch B               examples per rank and step (default 64)
  --lr X                  Adam's learning rate (default 1e-3)
  --train-size N          train on the first N examples only (default all)
  --resume                continue from the newest good checkpoint in --out, if there is one (without it,
                          a run starts afresh and removes the checkpoints an earlier run left in --out)
  --keep-checkpoints K    keep the newest K checkpoints (default 2), so a damaged one has a fallback
  --old-checkpoints       write checkpoints in the old format (checkpoint_epochE.pt, a TorchScript
                          archive) as earlier versions did
  --help                  this text
)";

struct Options {
  std::string data, out = "mnist_run";
  int epochs = 3, batch = 64, keep_checkpoints = 2;
  double lr = 1e-3;
  int64_t train_size = -1;
  bool resume = false, old_checkpoints = false, help = false;
};

Options parse(int argc, char** argv) {
  Options o;
  for (examples::Flags flags(argc, argv, "train_mnist"); flags.next();) {
    if (flags.is("--help") || flags.is("-h")) o.help = true;
    else if (flags.is("--data")) o.data = flags.value();
    else if (flags.is("--out")) o.out = flags.value();
    else if (flags.is("--epochs")) o.epochs = flags.number(1);
    else if (flags.is("--batch")) o.batch = flags.number(1);
    else if (flags.is("--lr")) o.lr = flags.number(1e-12);
    else if (flags.is("--train-size")) o.train_size = flags.number<int64_t>(1);
    else if (flags.is("--keep-checkpoints")) o.keep_checkpoints = flags.number(1);
    else if (flags.is("--resume")) o.resume = true;
    else if (flags.is("--old-checkpoints")) o.old_checkpoints = true;
    else flags.unknown();
  }
  if (!o.data.empty() && !fs::is_directory(o.data)) {  // before joining the job: fail fast, on every rank
    throw std::invalid_argument("--data " + o.data + (fs::exists(o.data) ? " is not a directory" : " does not exist") +
                                "; it must be the directory holding MNIST's idx files");
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

// MNIST's IDX files, checked as they are read (torch::data::datasets::MNIST reads a truncated
// file into uninitialized memory, and any label byte as a class): big-endian magic number
// 0x0000080N (unsigned bytes, N dimensions), N sizes, then the items.
torch::Tensor read_idx(const fs::path& file, int dims) {
  if (!fs::exists(file)) {
    if (fs::exists(file.string() + ".gz")) {
      throw std::runtime_error(file.string() + ".gz is compressed: gunzip it (MNIST's files are read uncompressed)");
    }
    throw std::runtime_error("missing " + file.string() + ": --data DIR must hold MNIST's four idx files (see --help)");
  }
  // A regular file's bytes (a FIFO of that name blocked the read for ever; a device was read without end).
  const std::string bytes = cpprun::detail::read_regular_file(file.string(), "MNIST file");
  const std::size_t header = 4 * (1 + dims);
  auto word = [&](int k) {
    uint32_t value = 0;
    for (int b = 0; b < 4; ++b) value = value << 8 | static_cast<unsigned char>(bytes[4 * k + b]);
    return value;
  };
  if (bytes.size() < header) {
    throw std::runtime_error(file.string() + " has " + std::to_string(bytes.size()) +
                             " bytes, fewer than an IDX header's " + std::to_string(header) + ": not an MNIST file");
  }
  const uint32_t magic = 0x800 + dims;
  if (word(0) != magic) {
    char text[160];
    std::snprintf(text, sizeof text, " starts with 0x%08x, not the IDX magic number 0x%08x of MNIST's %s file",
                  word(0), magic, dims == 3 ? "images" : "labels");
    throw std::runtime_error(file.string() + text);
  }
  std::vector<int64_t> shape;
  int64_t items = 1;
  for (int d = 0; d < dims; ++d) shape.push_back(word(1 + d)), items *= shape.back();
  if (dims == 3 && (shape[1] != 28 || shape[2] != 28)) {
    throw std::runtime_error(file.string() + " holds " + std::to_string(shape[1]) + "x" + std::to_string(shape[2]) +
                             " images; MNIST's are 28x28");
  }
  if (shape[0] == 0) throw std::runtime_error(file.string() + " holds no items");
  const uint64_t expected = header + static_cast<uint64_t>(items);
  if (bytes.size() != expected) {
    throw std::runtime_error(file.string() + (bytes.size() < expected ? " is truncated" : " is too long") +
                             ": its header promises " + std::to_string(shape[0]) + " items (" +
                             std::to_string(expected) + " bytes) but it has " + std::to_string(bytes.size()) + " bytes");
  }
  return torch::from_blob(const_cast<char*>(bytes.data() + header), shape, torch::kUInt8).clone();
}

// train-* or t10k-* images and labels, checked against each other.
Split read_mnist(const fs::path& dir, const std::string& prefix) {
  const fs::path images_file = dir / (prefix + "-images-idx3-ubyte"), labels_file = dir / (prefix + "-labels-idx1-ubyte");
  auto images = read_idx(images_file, 3);
  auto labels = read_idx(labels_file, 1).to(torch::kLong);
  if (images.size(0) != labels.size(0)) {
    throw std::runtime_error(images_file.string() + " holds " + std::to_string(images.size(0)) + " images but " +
                             labels_file.string() + " holds " + std::to_string(labels.size(0)) + " labels");
  }
  const auto bad = (labels > 9).nonzero();
  if (bad.numel() > 0) {
    const int64_t at = bad[0].item<int64_t>();
    throw std::runtime_error(labels_file.string() + ": label " + std::to_string(labels[at].item<int64_t>()) +
                             " of item " + std::to_string(at) + " is not a digit 0..9");
  }
  return {images.to(torch::kFloat32).div_(255).unsqueeze(1), labels};
}

std::pair<Split, Split> load_data(const std::string& dir, int rank) {
  if (dir.empty()) {
    if (rank == 0) std::printf("no --data DIR: using a generated stand-in set of MNIST's shape\n");
    return {stand_in(12000, 1), stand_in(2000, 2)};
  }
  return {read_mnist(dir, "train"), read_mnist(dir, "t10k")};
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

// A tick spacing of 1, 2 or 5 times a power of ten that cuts [0, span] into about `count` pieces.
double tick_step(double span, int count) {
  const double raw = std::max(span, 1e-12) / count, power = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0}) {
    if (m * power >= raw) return m * power;
  }
  return 10 * power;
}

// The loss curve as an SVG line chart: step on x, loss on y (from 0), ticks with their values, a
// light grid, and a dashed line where each epoch ends.
std::string svg_plot(const std::vector<double>& losses, int64_t steps_per_epoch) {
  const double w = 640, h = 400, left = 64, right = 24, top = 40, bottom = 52;
  const double highest = *std::max_element(losses.begin(), losses.end());
  const double y_step = highest > 0 ? tick_step(highest, 5) : 1, y_max = y_step * std::ceil(highest / y_step + 1e-9);
  const double steps = static_cast<double>(losses.size()), x_step = tick_step(steps, 6);
  const double x_max = x_step * std::ceil(steps / x_step);  // the axes end on a tick
  auto x = [&](double step) { return left + (w - left - right) * step / x_max; };
  auto y = [&](double loss) { return h - bottom - (h - top - bottom) * loss / y_max; };
  std::ostringstream svg;
  svg << "<svg xmlns='http://www.w3.org/2000/svg' width='" << w << "' height='" << h
      << "' font-family='sans-serif' font-size='12'>\n<rect width='100%' height='100%' fill='white'/>\n"
      << "<text x='" << w / 2 << "' y='22' text-anchor='middle' font-size='14'>train_mnist: training loss "
      << "(mean over ranks) per step</text>\n";
  for (int i = 0; i * y_step <= y_max + y_step / 2; ++i) {  // y ticks, labels and grid
    const double v = i * y_step;
    svg << "<line x1='" << left - 5 << "' y1='" << y(v) << "' x2='" << w - right << "' y2='" << y(v)
        << "' stroke='" << (v == 0 ? "black" : "#ddd") << "'/>\n<text x='" << left - 8 << "' y='" << y(v) + 4
        << "' text-anchor='end'>" << v << "</text>\n";
  }
  for (int i = 0; i * x_step <= x_max + x_step / 2; ++i) {  // x ticks, labels and grid
    const double s = i * x_step;
    svg << "<line x1='" << x(s) << "' y1='" << top << "' x2='" << x(s) << "' y2='" << h - bottom + 5 << "' stroke='"
        << (s == 0 ? "black" : "#ddd") << "'/>\n<text x='" << x(s) << "' y='" << h - bottom + 20
        << "' text-anchor='middle'>" << s << "</text>\n";
  }
  for (int64_t end = steps_per_epoch; steps_per_epoch > 0 && end < static_cast<int64_t>(losses.size());
       end += steps_per_epoch) {
    svg << "<line x1='" << x(end) << "' y1='" << top << "' x2='" << x(end) << "' y2='" << h - bottom
        << "' stroke='gray' stroke-dasharray='4 3'/>\n<text x='" << x(end) + 4 << "' y='" << top + 12
        << "' font-size='10' fill='gray'>epoch " << end / steps_per_epoch << " ends</text>\n";
  }
  svg << "<polyline fill='none' stroke='steelblue' stroke-width='1.5' points='";
  for (size_t i = 0; i < losses.size(); ++i) svg << x(i + 1) << ',' << y(losses[i]) << ' ';
  svg << "'/>\n<text x='" << left + (w - left - right) / 2 << "' y='" << h - 12 << "' text-anchor='middle'>step</text>\n"
      << "<text transform='translate(18," << top + (h - top - bottom) / 2 << ") rotate(-90)' text-anchor='middle'>"
      << "loss (cross-entropy)</text>\n</svg>\n";
  return svg.str();
}

// Checkpoints are OUT/checkpoint_epoch<E>/ (written after epoch E: model.safetensors,
// optimizer.safetensors, trainer.json), or OUT/checkpoint_epoch<E>.pt from earlier versions;
// listed newest first. A directory is written as checkpoint_epoch<E>.tmp/ and renamed when whole,
// so a half-written one is never listed; one that fails (a full disk) is removed.
fs::path checkpoint_dir(const std::string& out, int epoch) {
  return fs::path(out) / ("checkpoint_epoch" + std::to_string(epoch));
}
fs::path old_checkpoint_file(const std::string& out, int epoch) {
  return fs::path(out) / ("checkpoint_epoch" + std::to_string(epoch) + ".pt");
}

std::vector<std::pair<int, fs::path>> checkpoints_in(const std::string& out) {
  const std::string prefix = "checkpoint_epoch";
  std::vector<std::pair<int, fs::path>> found;
  for (const auto& entry : fs::directory_iterator(out)) {
    std::string name = entry.path().filename().string();
    const bool old = name.size() > 3 && name.compare(name.size() - 3, 3, ".pt") == 0;
    if (old) name.resize(name.size() - 3);
    else if (!entry.is_directory()) continue;
    if (name.size() <= prefix.size() || name.rfind(prefix, 0) != 0) continue;
    const std::string digits = name.substr(prefix.size());
    if (digits.find_first_not_of("0123456789") != std::string::npos || digits.size() > 6) continue;
    found.emplace_back(std::stoi(digits), entry.path());
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return found;
}

// Older checkpoints go only once the newest is safely written.
void prune_checkpoints(const Options& opt) {
  const auto checkpoints = checkpoints_in(opt.out);
  for (size_t i = opt.keep_checkpoints; i < checkpoints.size(); ++i) fs::remove_all(checkpoints[i].second);
}

// A checkpoint whose model and optimizer are being written in the background (cpprun::save_async):
// its directory is PARTIAL (.tmp) until both are on disk.
struct PendingCheckpoint {
  cpprun::AsyncSave save;
  fs::path partial, dir;
};

// Removes a checkpoint that could not be written (a full disk), so that it does not keep the
// disk full; the error that stopped it is the caller's to raise.
void remove_partial(const fs::path& partial) {
  std::error_code ignored;
  fs::remove_all(partial, ignored);
}

// Waits for the pending checkpoint, renames it into place, and prunes. A failed write raises its
// error here, once its .tmp directory is removed.
void finish_checkpoint(std::optional<PendingCheckpoint>& pending, const Options& opt) {
  if (!pending) return;
  PendingCheckpoint done = std::move(*pending);
  pending.reset();
  try {
    done.save.wait();
  } catch (...) {
    remove_partial(done.partial);
    throw;
  }
  fs::remove_all(done.dir);  // a damaged one of the same epoch, from a run that resumed before it
  fs::rename(done.partial, done.dir);
  prune_checkpoints(opt);
}

// trainer.json: {"epoch": E, "save_id": "...", "losses": [...]}, the epoch last finished
// (0-based), the save id its model and optimizer files record, and the loss per step so far, for
// the plot.
std::string trainer_json(int epoch, const std::string& save_id, const std::vector<double>& losses) {
  std::string out = "{\"epoch\": " + std::to_string(epoch) + ", \"save_id\": \"" + save_id + "\", \"losses\": [";
  char number[32];
  for (size_t i = 0; i < losses.size(); ++i) {
    std::snprintf(number, sizeof number, "%s%.17g", i ? ", " : "", losses[i]);
    out += number;
  }
  return out + "]}\n";
}
// `save_id`: empty in a trainer.json written before it was recorded.
void read_trainer_json(const fs::path& file, int& epoch, std::string& save_id, std::vector<double>& losses) {
  if (!fs::is_regular_file(file)) {  // a FIFO there would block the read forever
    throw std::runtime_error("checkpoint " + file.string() + " is damaged: trainer.json is not a regular file");
  }
  std::ifstream in(file);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto epoch_at = text.find("\"epoch\":"), losses_at = text.find("\"losses\": [");
  if (!in || epoch_at == std::string::npos || losses_at == std::string::npos || text.find(']') == std::string::npos) {
    throw std::runtime_error("checkpoint " + file.string() + " is damaged: not {\"epoch\": E, \"losses\": [...]}");
  }
  const std::size_t digits_at = text.find_first_not_of(' ', epoch_at + 8);
  const std::size_t digits_end = text.find_first_not_of("0123456789", digits_at);
  epoch = examples::number<int>("checkpoint " + file.string() + "'s \"epoch\"",
                                text.substr(digits_at, digits_end == std::string::npos ? digits_end : digits_end - digits_at), 0);
  save_id.clear();
  const std::string id_key = "\"save_id\": \"";
  if (const auto id_at = text.find(id_key); id_at != std::string::npos) {
    const auto id_end = text.find('"', id_at + id_key.size());
    if (id_end == std::string::npos) {
      throw std::runtime_error("checkpoint " + file.string() + " is damaged: its \"save_id\" has no end");
    }
    save_id = text.substr(id_at + id_key.size(), id_end - id_at - id_key.size());
  }
  losses.clear();
  const char* at = text.c_str() + losses_at + 11;
  while (*at != ']') {
    char* end = nullptr;
    losses.push_back(std::strtod(at, &end));
    if (end == at) throw std::runtime_error("checkpoint " + file.string() + " is damaged: a loss is not a number");
    at = end;
    while (*at == ',' || *at == ' ') ++at;
  }
}

int run(int argc, char** argv) {
  const Options opt = parse(argc, argv);
  if (opt.help) return examples::print_usage(kUsage);
  auto group = cpprun::init_process_group();
  const int rank = group.rank();
  auto [train, test] = load_data(opt.data, rank);
  if (opt.train_size > 0 && opt.train_size < train.labels.size(0)) {
    train = {train.images.narrow(0, 0, opt.train_size), train.labels.narrow(0, 0, opt.train_size)};
  }
  std::error_code out_error;
  fs::create_directories(opt.out, out_error);
  if (out_error || !fs::is_directory(opt.out)) {
    throw std::invalid_argument("--out " + opt.out + ": cannot make that directory (" +
                                (out_error ? out_error.message() : std::string("a file of that name is there")) +
                                "); it holds the checkpoints, loss.csv and loss.svg: name one this process may write");
  }

  // A fresh run (no --resume) replaces the checkpoints an earlier run left in --out, once it has its
  // first to put in their place (a run that fails before then keeps them): kept, the earlier run's
  // later epochs outranked this run's (pruning removed this run's newest, and a --resume continued
  // the earlier run, its losses rewriting loss.csv).
  bool earlier_runs_to_remove = !opt.resume && rank == 0;
  const auto remove_earlier_runs = [&] {
    if (!earlier_runs_to_remove) return;
    earlier_runs_to_remove = false;
    const auto earlier = checkpoints_in(opt.out);
    std::string names;
    for (const auto& [epoch, path] : earlier) {
      names += (names.empty() ? "" : ", ") + path.filename().string();
      fs::remove_all(path);
    }
    if (!earlier.empty()) {
      std::printf("note: starting afresh (no --resume): removed the %zu checkpoints an earlier run left in %s (%s)\n",
                  earlier.size(), opt.out.c_str(), names.c_str());
    }
  };

  torch::manual_seed(0);
  Net net;
  torch::optim::Adam optimizer(net->parameters(), torch::optim::AdamOptions(opt.lr));
  int start_epoch = 0;
  std::optional<PendingCheckpoint> pending;  // rank 0's checkpoint being written in the background
  std::vector<double> losses;  // global loss per step, kept in the checkpoint for the plot
  if (opt.resume) {
    // The newest checkpoint that passes its checksum; a damaged one is named and skipped. Every
    // rank reads the same files, so all resume from the same one.
    const auto checkpoints = checkpoints_in(opt.out);
    bool resumed = false;
    for (const auto& [epoch, path] : checkpoints) {
      int saved_epoch = 0;
      try {
        if (path.extension() == ".pt") {
          // An earlier version's checkpoint: torch::save's archive of the module and optimizer.
          torch::serialize::InputArchive archive;
          cpprun::load_checkpoint(archive, path.string());
          net->load(archive);
          optimizer.load(archive);
          torch::Tensor epoch_tensor, saved_losses;
          archive.read("epoch", epoch_tensor);
          archive.read("losses", saved_losses);
          saved_epoch = epoch_tensor.item<int>();
          losses.assign(saved_losses.data_ptr<double>(), saved_losses.data_ptr<double>() + saved_losses.numel());
          if (rank == 0) {
            std::printf("note: %s is in the old format (a TorchScript archive); loaded, and new checkpoints are "
                        "directories of safetensors files\n", path.c_str());
          }
        } else {
          // Strict: another model's or optimizer's files are refused by name, changing nothing.
          std::string save_id;
          read_trainer_json(path / "trainer.json", saved_epoch, save_id, losses);
          // trainer.json copied from another checkpoint would resume another epoch's weights.
          const fs::path model = path / "model.safetensors";
          if (const auto metadata = cpprun::detail::read_safetensors_metadata(model.string())) {
            const auto id = metadata->find(std::string(cpprun::detail::kSaveIdKey));
            if (!save_id.empty() && id != metadata->end() && id->second != save_id) {
              throw std::runtime_error("checkpoint " + path.string() + " does not hold together: trainer.json is "
                                       "from another save (save id \"" + save_id + "\") than " + model.string() +
                                       " (\"" + id->second + "\")");
            }
          }
          // The pair load refuses a model and an optimizer of different saves (a copied file).
          cpprun::load_state_dict(net, optimizer, model.string(), (path / "optimizer.safetensors").string());
        }
      } catch (const std::exception& e) {
        if (rank == 0) std::fprintf(stderr, "%s\nskipping %s: trying the checkpoint before it\n", e.what(), path.c_str());
        continue;
      }
      start_epoch = saved_epoch + 1;
      if (rank == 0) std::printf("resuming after epoch %d from %s\n", start_epoch, path.c_str());
      resumed = true;
      break;
    }
    if (!resumed && !checkpoints.empty()) {
      throw std::runtime_error("--resume: none of the " + std::to_string(checkpoints.size()) + " checkpoints in " +
                               opt.out + " passes its check (above); remove them to start afresh");
    }
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
      if (pending && pending->save.done()) finish_checkpoint(pending, opt);  // rank 0's, written meanwhile
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
      remove_earlier_runs();  // this run's first checkpoint comes next
      if (opt.old_checkpoints) {
        torch::serialize::OutputArchive archive;
        net->save(archive);
        optimizer.save(archive);
        archive.write("epoch", torch::tensor(epoch));
        archive.write("losses", torch::tensor(losses, torch::kDouble));
        cpprun::save_checkpoint(archive, old_checkpoint_file(opt.out, epoch + 1).string());  // atomic, checksummed
      } else {
        // Each file atomic and checksummed, one save id in both. The model and the optimizer are
        // copied now and written while the next epoch trains; the directory is renamed into place
        // (finish_checkpoint) only once both are on disk, so it appears whole or not at all.
        finish_checkpoint(pending, opt);
        const fs::path dir = checkpoint_dir(opt.out, epoch + 1), partial = dir.string() + ".tmp";
        fs::remove_all(partial);
        try {
          fs::create_directories(partial);
          const std::string save_id = cpprun::new_save_id();
          cpprun::write_file_atomically((partial / "trainer.json").string(), trainer_json(epoch, save_id, losses));
          const auto options = cpprun::StateDictSaveOptions().step(epoch + 1).save_id(save_id);
          pending = PendingCheckpoint{cpprun::save_async(net, optimizer, (partial / "model.safetensors").string(),
                                                         (partial / "optimizer.safetensors").string(), options),
                                      partial, dir};
        } catch (...) {
          remove_partial(partial);
          throw;
        }
      }
      if (!pending) prune_checkpoints(opt);
    }
  }
  if (rank == 0) finish_checkpoint(pending, opt);

  const double accuracy = evaluate(net, test, group);  // collective: every rank calls it
  if (rank == 0 && !losses.empty()) {
    std::ostringstream csv;
    csv << "step,loss\n";
    for (size_t i = 0; i < losses.size(); ++i) csv << i + 1 << ',' << losses[i] << '\n';
    cpprun::write_file_atomically((fs::path(opt.out) / "loss.csv").string(), csv.str());
    cpprun::write_file_atomically((fs::path(opt.out) / "loss.svg").string(), svg_plot(losses, steps_per_epoch));
    std::printf("final test accuracy %.2f%%; loss curve in %s/loss.csv and loss.svg\n", 100 * accuracy, opt.out.c_str());
  }
  return 0;
}

// Any error (a bad option, a missing or damaged file) ends with its message and exit code 1,
// written where cpprun's failure summary shows it, rather than an abort.
int main(int argc, char** argv) { return cpprun::record([&] { return run(argc, argv); }); }
