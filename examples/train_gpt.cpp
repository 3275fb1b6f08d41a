// Trains a small character-level GPT on a text file with cpprun, then prints tokens/s, the peak
// memory per rank, the held-out loss and a generated sample.
//
//   single process:  ./build/examples/train_gpt
//   two ranks:       ./build/launcher/cpprun --nproc_per_node=2 ./build/examples/train_gpt --mode ddp
//   sharded:         ./build/launcher/cpprun --nproc_per_node=2 ./build/examples/train_gpt --mode fsdp --stage 2
//   larger:          ... --mode fsdp --stage 3 --checkpoint-activations --amp fp16
//                    (at stage 3 the model is built with deferred initialisation: FSDP materialises it
//                    block by block, so no rank ever holds all of it)
//   options:         ./build/examples/train_gpt --help
#include <ATen/autocast_mode.h>
#include <cpprun/cpprun.h>
#include <torch/torch.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "../bench/peak_rss.h"  // the memory benchmarks' measure (VmHWM)
#include "flag_value.h"

constexpr const char* kUsage = R"(usage: train_gpt [options]
  --text FILE        the text to learn (default /usr/share/common-licenses/GPL-3, on every Debian machine)
  --mode ddp|fsdp    DistributedDataParallel, or FullyShardedDataParallel with one unit per block (default ddp)
  --stage 1|2|3      ZeRO stage with --mode fsdp (default 2)
  --steps N          optimizer steps (default 300)
  --batch B          windows per rank and step (default 16)
  --lr X             AdamW's learning rate (default 3e-3)
  --block T          characters per window (default 64)
  --layers L         transformer blocks (default 2)
  --embed C          embedding width, a multiple of --heads (default 64)
  --heads H          attention heads (default 4)
  --sample N         characters to generate at the end (default 200)
  --checkpoint-activations
                     recompute each block's activations in backward instead of keeping them
  --amp fp32|bf16|fp16
                     autocast precision (default fp32); fp16 scales the loss (cpprun::GradScaler)
  --deferred-init on|off
                     build the model without memory (cpprun::deferred_init) and materialise it block by
                     block while sharding it (FSDP), or at once (DDP); the same values either way
                     (default on with --mode fsdp --stage 3, else off)
  --help             this text
)";

struct Options {
  std::string text = "/usr/share/common-licenses/GPL-3", mode = "ddp";
  int steps = 300, batch = 16, sample = 200, stage = 2;
  int64_t block = 64, layers = 2, embed = 64, heads = 4;
  double lr = 3e-3;
  bool help = false, checkpoint_activations = false;
  std::string amp = "fp32", deferred_init = "auto";
};

Options parse(int argc, char** argv) {
  Options o;
  for (examples::Flags flags(argc, argv, "train_gpt"); flags.next();) {
    if (flags.is("--help") || flags.is("-h")) o.help = true;
    else if (flags.is("--text")) o.text = flags.value();
    else if (flags.is("--mode")) o.mode = flags.value();
    else if (flags.is("--stage")) o.stage = flags.number(1);
    else if (flags.is("--steps")) o.steps = flags.number(1);
    else if (flags.is("--batch")) o.batch = flags.number(1);
    else if (flags.is("--lr")) o.lr = flags.number(1e-12);
    else if (flags.is("--block")) o.block = flags.number<int64_t>(1);
    else if (flags.is("--layers")) o.layers = flags.number<int64_t>(1);
    else if (flags.is("--embed")) o.embed = flags.number<int64_t>(1);
    else if (flags.is("--heads")) o.heads = flags.number<int64_t>(1);
    else if (flags.is("--sample")) o.sample = flags.number(0);
    else if (flags.is("--checkpoint-activations")) o.checkpoint_activations = true;
    else if (flags.is("--amp")) o.amp = flags.value();
    else if (flags.is("--deferred-init")) o.deferred_init = flags.value();
    else flags.unknown();
  }
  if (o.mode != "ddp" && o.mode != "fsdp") throw std::invalid_argument("--mode must be ddp or fsdp, got " + o.mode);
  if (o.amp != "fp32" && o.amp != "bf16" && o.amp != "fp16") {
    throw std::invalid_argument("--amp must be fp32, bf16 or fp16, got " + o.amp);
  }
  if (o.deferred_init != "auto" && o.deferred_init != "on" && o.deferred_init != "off") {
    throw std::invalid_argument("--deferred-init must be on or off, got " + o.deferred_init);
  }
  if (o.deferred_init == "auto") o.deferred_init = o.mode == "fsdp" && o.stage == 3 ? "on" : "off";
  if (o.stage > 3) throw std::invalid_argument("--stage must be 1, 2 or 3, got " + std::to_string(o.stage));
  if (o.embed % o.heads != 0) {
    throw std::invalid_argument("--embed " + std::to_string(o.embed) + " must be a multiple of --heads " +
                                std::to_string(o.heads));
  }
  return o;
}

// Causal self-attention: each position attends to itself and the positions before it.
struct AttentionImpl : torch::nn::Module {
  int64_t heads;
  torch::nn::Linear qkv{nullptr}, proj{nullptr};
  AttentionImpl(int64_t embed, int64_t heads) : heads(heads) {
    qkv = register_module("qkv", torch::nn::Linear(embed, 3 * embed));
    proj = register_module("proj", torch::nn::Linear(embed, embed));
  }
  torch::Tensor forward(torch::Tensor x) {
    const int64_t B = x.size(0), T = x.size(1), C = x.size(2), D = C / heads;
    auto parts = qkv(x).view({B, T, 3, heads, D}).permute({2, 0, 3, 1, 4});  // [3, B, H, T, D]
    auto q = parts[0], k = parts[1], v = parts[2];
    auto scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(D));
    auto future = torch::ones({T, T}, x.options().dtype(torch::kBool)).triu(1);
    auto att = torch::softmax(scores.masked_fill(future, -INFINITY), -1);
    return proj(torch::matmul(att, v).transpose(1, 2).reshape({B, T, C}));
  }
};
TORCH_MODULE(Attention);

struct BlockImpl : torch::nn::Module {
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  Attention attention{nullptr};
  torch::nn::Sequential mlp{nullptr};
  BlockImpl(int64_t embed, int64_t heads) {
    ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({embed})));
    attention = register_module("attention", Attention(embed, heads));
    ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({embed})));
    mlp = register_module("mlp", torch::nn::Sequential(torch::nn::Linear(embed, 4 * embed), torch::nn::GELU(),
                                                       torch::nn::Linear(4 * embed, embed)));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = x + attention(ln1(x));
    return x + mlp->forward(ln2(x));
  }
};
TORCH_MODULE(Block);

// The output layer is the token embedding, transposed (tied weights, as GPT-2): one tensor under
// the names "tokens.weight" and "head.weight", whose two uses' gradients autograd sums.
struct TiedHeadImpl : torch::nn::Module {
  torch::Tensor weight;
  explicit TiedHeadImpl(const torch::Tensor& embedding) { weight = register_parameter("weight", embedding); }
  torch::Tensor forward(const torch::Tensor& x) { return torch::matmul(x, weight.t()); }
};
TORCH_MODULE(TiedHead);

struct GptImpl : torch::nn::Module {
  torch::nn::Embedding tokens{nullptr}, positions{nullptr};
  std::vector<Block> blocks;
  torch::nn::LayerNorm ln{nullptr};
  TiedHead head{nullptr};
  bool checkpoint_activations;
  GptImpl(int64_t vocab, const Options& o) : checkpoint_activations(o.checkpoint_activations) {
    tokens = register_module("tokens", torch::nn::Embedding(vocab, o.embed));
    positions = register_module("positions", torch::nn::Embedding(o.block, o.embed));
    for (int64_t i = 0; i < o.layers; ++i) blocks.push_back(register_module("block" + std::to_string(i), Block(o.embed, o.heads)));
    ln = register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.embed})));
    head = register_module("head", TiedHead(tokens->weight));
    // Small embeddings (GPT-2's 0.02): the tied head's logits start near zero, not at N(0, embed).
    torch::NoGradGuard no_grad;
    torch::nn::init::normal_(tokens->weight, 0, 0.02);
    torch::nn::init::normal_(positions->weight, 0, 0.02);
  }
  torch::Tensor forward(torch::Tensor idx) {  // [B, T] -> logits [B, T, vocab]
    auto x = tokens(idx) + positions(torch::arange(idx.size(1), idx.options()));
    for (auto& block : blocks) {
      // Checkpointed, a block keeps only its input for backward, which runs it again.
      x = checkpoint_activations
              ? cpprun::checkpoint([b = block.ptr()](const torch::Tensor& h) { return b->forward(h); }, x)
              : block(x);
    }
    return head(ln(x));
  }
};
TORCH_MODULE(Gpt);

int run(int argc, char** argv) {
  const Options opt = parse(argc, argv);
  if (opt.help) return examples::print_usage(kUsage);
  auto group = cpprun::init_process_group();
  const int rank = group.rank();

  std::ifstream file(opt.text);
  if (!file) throw std::runtime_error("cannot read --text " + opt.text + ": " + std::strerror(errno));
  std::stringstream contents;
  contents << file.rdbuf();
  const std::string text = contents.str();
  // Training windows come from the first nine tenths, held-out windows from the last tenth.
  const int64_t needed = 10 * (opt.block + 2);
  if (static_cast<int64_t>(text.size()) < needed) {
    throw std::invalid_argument("--text " + opt.text + " has " + std::to_string(text.size()) + " characters; --block " +
                                std::to_string(opt.block) + " needs at least " + std::to_string(needed));
  }
  std::string vocab;  // the characters that occur, sorted
  for (int c = 0; c < 256; ++c) {
    if (text.find(static_cast<char>(c)) != std::string::npos) vocab += static_cast<char>(c);
  }
  std::vector<int64_t> ids;
  for (char c : text) ids.push_back(static_cast<int64_t>(vocab.find(c)));
  auto encoded = torch::tensor(ids, torch::kLong);
  // The last tenth is held out; training windows start anywhere in the rest.
  const int64_t split = encoded.size(0) * 9 / 10, windows = split - opt.block - 1;

  // This rank's GPU where there is one (cuda:LOCAL_RANK), else the CPU: model and data live there.
  const auto device = cpprun::local_device();
  encoded = encoded.to(device);
  torch::manual_seed(0);
  auto build = [&] { return Gpt(static_cast<int64_t>(vocab.size()), opt); };
  // Deferred: the parameters get memory (and the values eager construction gives) only when the
  // wrapper materialises them, under ZeRO-3 one block at a time, keeping only this rank's shard.
  Gpt gpt = opt.deferred_init == "on" ? cpprun::deferred_init(build) : build();
  if (!device.is_cpu()) gpt->to(device);  // on a deferred module, recorded for materialisation
  if (opt.deferred_init == "on" && opt.mode == "ddp") cpprun::materialize(gpt);
  // DDP replicates everything; FSDP (ZeRO) shards optimizer state, at stage 2 also gradients and
  // at stage 3 also parameters, one unit per transformer block. Either is a DataParallel<Gpt>:
  // the training loop below is the same for both.
  auto per_block = [](const torch::nn::Module& m) { return dynamic_cast<const BlockImpl*>(&m) != nullptr; };
  auto per_block_fsdp = cpprun::FsdpOptions().stage(opt.stage).wrap_policy(per_block);
  cpprun::DataParallel<GptImpl> model = nullptr;
  if (opt.mode == "ddp") model = cpprun::DistributedDataParallel(gpt, group);
  else model = cpprun::FullyShardedDataParallel(gpt, group, per_block_fsdp);
  // AdamW as nanoGPT builds it: weight decay on 2-D weights (matmuls, embeddings) only, not on
  // biases and norms. By name and shape, the same under DDP and FSDP (whose parameters are this
  // rank's rows of each, under the model's own names); each tensor once (the tied embedding has
  // two names).
  std::vector<torch::Tensor> decay, no_decay;
  for (const auto& item : cpprun::unique_named_parameters(*model)) {
    (item.value().dim() >= 2 ? decay : no_decay).push_back(item.value());
  }
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(
                                 torch::optim::AdamWOptions(opt.lr).weight_decay(0.1)));
  groups.emplace_back(no_decay, std::make_unique<torch::optim::AdamWOptions>(
                                    torch::optim::AdamWOptions(opt.lr).weight_decay(0)));
  torch::optim::AdamW optimizer(groups, torch::optim::AdamWOptions(opt.lr));
  // Mixed precision by autocast (matmuls in bf16 or fp16, parameters and optimizer in fp32); fp16's
  // narrow range needs the loss scaled, and an overflow on any rank skips the step on all.
  const auto device_type = device.type();
  if (opt.amp != "fp32") {
    at::autocast::set_autocast_dtype(device_type, opt.amp == "bf16" ? at::kBFloat16 : at::kHalf);
  }
  cpprun::GradScaler scaler(group, cpprun::GradScalerOptions().enabled(opt.amp == "fp16"));
  int skipped = 0;
  cpprun::DistributedSampler sampler(static_cast<size_t>(windows), group);
  auto batch_from = [&](const std::vector<size_t>& starts) {  // inputs and next-character targets
    std::vector<torch::Tensor> x, y;
    for (size_t s : starts) {
      x.push_back(encoded.narrow(0, static_cast<int64_t>(s), opt.block));
      y.push_back(encoded.narrow(0, static_cast<int64_t>(s) + 1, opt.block));
    }
    return std::make_pair(torch::stack(x), torch::stack(y));
  };
  if (rank == 0) {
    int64_t params = 0;
    for (const auto& p : cpprun::unique_parameters(*gpt)) params += p.numel();
    std::printf("%s: %zu characters, vocabulary %zu, %lld parameters%s, %d ranks x %d windows of %lld\n",
                opt.text.c_str(), text.size(), vocab.size(), static_cast<long long>(params),
                opt.deferred_init == "on" ? " (deferred initialisation)" : "", group.size(), opt.batch,
                static_cast<long long>(opt.block));
  }

  sampler.reset();
  double first_loss = 0, loss_sum = 0;
  const auto started = std::chrono::steady_clock::now();
  for (int step = 1; step <= opt.steps; ++step) {
    auto starts = sampler.next(opt.batch);
    if (!starts || starts->size() < static_cast<size_t>(opt.batch)) sampler.reset(), starts = sampler.next(opt.batch);
    auto [x, y] = batch_from(*starts);
    optimizer.zero_grad();
    at::autocast::set_autocast_enabled(device_type, opt.amp != "fp32");
    auto logits = model->forward(x);
    at::autocast::set_autocast_enabled(device_type, false);
    auto loss = torch::nn::functional::cross_entropy(logits.view({-1, logits.size(-1)}).to(torch::kFloat), y.view({-1}));
    scaler.scale(loss).backward();
    if (!scaler.step(optimizer)) ++skipped;
    scaler.update();
    auto global = loss.detach().clone();
    cpprun::all_reduce(group, global, cpprun::ReduceOp::kAvg);
    if (step == 1) first_loss = global.item<double>();
    loss_sum += global.item<double>();
    if (rank == 0 && step % 50 == 0) {
      std::printf("step %4d/%d  loss %.4f\n", step, opt.steps, loss_sum / 50);
      std::fflush(stdout);
      loss_sum = 0;
    }
  }

  // Throughput over all ranks, and the largest rank's peak memory (a collective: every rank).
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  // This rank's peak resident memory: model, gradients, optimizer state and activations at most
  // (host memory; on a GPU see the CUDA allocator).
  auto peak = torch::tensor({bench::peak_rss() / 1048576.0}, torch::kDouble);
  cpprun::all_reduce(group, peak, cpprun::ReduceOp::kMax);
  const double tokens = static_cast<double>(opt.steps) * opt.batch * opt.block * group.size();

  // Held-out loss, then a sample from rank 0 (greedy decoding would repeat itself: sample).
  model->gather_full_parameters();  // FSDP: gpt's own weights made current; DDP: they are
  torch::NoGradGuard no_grad;
  gpt->eval();
  std::vector<size_t> held_out;
  for (int64_t s = split; s + opt.block + 1 < encoded.size(0) && held_out.size() < 64; s += opt.block) held_out.push_back(s);
  auto [vx, vy] = batch_from(held_out);
  auto vlogits = gpt->forward(vx);
  auto val = torch::nn::functional::cross_entropy(vlogits.view({-1, vlogits.size(-1)}), vy.view({-1}));
  if (rank != 0) return 0;
  std::printf("first loss %.4f, held-out loss %.4f\n", first_loss, val.item<double>());
  std::printf("%.0f tokens/s over %d ranks; peak memory per rank %.0f MB (the largest rank's resident memory)\n",
              tokens / seconds, group.size(), peak.item<double>());
  if (opt.amp == "fp16") std::printf("fp16: %d of %d steps skipped for overflow, loss scale now %g\n", skipped, opt.steps, scaler.get_scale());
  auto context = encoded.narrow(0, split, opt.block).unsqueeze(0);
  auto generator = at::make_generator<at::CPUGeneratorImpl>(1);
  std::string sample;
  for (int i = 0; i < opt.sample; ++i) {
    auto probabilities = torch::softmax(gpt->forward(context).select(1, -1) / 0.8, -1);
    auto next = torch::multinomial(probabilities.cpu(), 1, false, generator).to(device);  // a CPU generator
    sample += vocab[static_cast<size_t>(next.item<int64_t>())];
    context = torch::cat({context.narrow(1, 1, opt.block - 1), next}, 1);
  }
  std::printf("sample:\n%s\n", sample.c_str());
  return 0;
}

// Any error (a bad option, an unreadable --text) ends with its message and exit code 1, written
// where cpprun's failure summary shows it (cpprun::record), rather than an abort.
int main(int argc, char** argv) { return cpprun::record([&] { return run(argc, argv); }); }
