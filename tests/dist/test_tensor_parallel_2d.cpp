// Tensor parallelism composed with data parallelism on a {dp, tp} DeviceMesh, under
// `cpprun --nproc_per_node=K`: tp = 2 when K is even (else 1), dp = K / tp; at K = 4, {dp 2, tp 2},
// and for the block stack also {dp 1, tp 4}.
// A stack of residual MLP blocks, each split Megatron-style (column- then row-parallel, optionally
// with its LayerNorm on sequence shards), wrapped in DDP or FSDP ZeRO-1/2/3 over the dp dimension,
// optionally with activation checkpointing around each block, trains 6 AdamW steps with gradient
// clipping against the same stack in one process on the global batch, all in float64: every step's
// loss and clipped norm, and the gathered parameters, within 1e-10 (under DDP also clipped by
// cpprun::clip_grad_norm_(model->parameters()); under FSDP that is refused); so does a language model whose
// head is its vocabulary-parallel embedding, and a small GPT (tp_gpt.h: causal attention split by
// heads, dropout on the attention probabilities, the head tied to the vocabulary-parallel
// embedding), with and without sequence parallelism and activation checkpointing. Also: the loss
// scaler agrees over both dimensions, a data-parallel group spanning a tensor-parallel one is
// refused, and save_state_dict writes whole tensors (a file or a sharded directory; in memory,
// get_model_state_dict) that load into an unsplit stack and into other splits.
#include "catch.h"
#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "cpprun/cpprun.h"
#include "ddp_test_models.h"
#include "dist_test_support.h"
#include "tied_lm.h"
#include "tp_gpt.h"

using dist_test::group;
using ddp_test::relative_difference;

namespace {

// Models and data are float64, so that the split models and the one-process reference differ by
// summation order alone: the worst over every case at 1 to 4 ranks was 3.8e-13 (relative; each
// compared value's largest, printed per rank). A wrong gradient moves a parameter by about the
// learning rate per AdamW step, far past it. (In float32 the GPT's h.1.v.0.weight differed by
// 1.7e-5 at {dp 3, tp 1} on one CPU and not on another.)
constexpr double kTolerance = 1e-10;
constexpr int kSteps = 6;
constexpr int64_t kHidden = 12, kSequence = 8, kPerReplica = 2;  // kSequence and kHidden divide by tp
// More tokens than features: with fewer, the keys' projection has directions whose gradient is
// close to nothing (attention ignores what shifts every key alike), where AdamW's steps magnify
// rounding (past 1e-5 when these tests ran in float32).
constexpr int64_t kGptSequence = 24;
constexpr double kMaxNorm = 0.05;  // below the gradients' norm: clipping scales every step

// The tensor-parallel size the test cases run at: 2 at an even rank count, else 1; the parity
// test also runs the whole job as one TP group when it has 4 ranks ({dp 1, tp 4}).
int default_tp() { return group().size() % 2 == 0 ? 2 : 1; }
int current_tp = 0;  // 0: default_tp()

std::vector<int> parity_tp_sizes() {
  std::vector<int> sizes{default_tp()};
  if (group().size() == 4) sizes.push_back(4);
  return sizes;
}

// The {dp, tp} mesh at the current TP size, made once per size (collective: every rank reaches
// each size in the same order).
const cpprun::DeviceMesh& mesh() {
  static std::map<int, cpprun::DeviceMesh> meshes;
  const int tp = current_tp ? current_tp : default_tp();
  auto found = meshes.find(tp);
  if (found == meshes.end()) {
    found = meshes.emplace(tp, cpprun::DeviceMesh(group(), {group().size() / tp, tp}, {"dp", "tp"})).first;
  }
  return found->second;
}

// x + block(x) for each block; a block is LayerNorm, Linear 12->48, GELU, Linear 48->12, Dropout,
// called through the registry so that parallelize_module's replacements are the ones called.
struct StackImpl : torch::nn::Module {
  explicit StackImpl(int64_t blocks) {
    torch::manual_seed(5);
    for (int64_t b = 0; b < blocks; ++b) {
      h->push_back(torch::nn::Sequential(torch::nn::LayerNorm(torch::nn::LayerNormOptions({kHidden})),
                                         torch::nn::Linear(kHidden, 4 * kHidden), torch::nn::GELU(),
                                         torch::nn::Linear(4 * kHidden, kHidden), torch::nn::Dropout(0.2)));
    }
    register_module("h", h);
    to(torch::kDouble);
  }
  at::Tensor forward(at::Tensor x) {
    for (const auto& entry : *h) {
      auto block = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(entry);
      x = x + (checkpoint_blocks ? cpprun::checkpoint([block](const at::Tensor& in) { return block->forward(in); }, x)
                                 : block->forward(x));
    }
    return x;
  }
  torch::nn::ModuleList h;
  bool checkpoint_blocks = false;
};
TORCH_MODULE(Stack);

constexpr int64_t kBlocks = 2;

cpprun::ParallelizePlan megatron_plan(bool sequence_parallel) {
  cpprun::ColwiseParallel colwise;
  cpprun::RowwiseParallel rowwise;
  if (sequence_parallel) {
    colwise.input_layouts(cpprun::Shard(1));
    rowwise.output_layouts(cpprun::Shard(1));
  }
  cpprun::ParallelizePlan plan;
  for (int64_t b = 0; b < kBlocks; ++b) {
    const std::string block = "h." + std::to_string(b) + ".";
    plan.push_back({block + "1", colwise});
    plan.push_back({block + "3", rowwise});
    if (sequence_parallel) {  // the LayerNorm and the dropout run on sequence shards
      plan.push_back({block + "0", cpprun::SequenceParallel()});
      plan.push_back({block + "4", cpprun::SequenceParallel()});
    }
  }
  return plan;
}

cpprun::DataParallel<StackImpl> wrap(const std::string& how, const Stack& net) {
  const auto& dp = mesh().group("dp");
  if (how.rfind("ddp", 0) == 0) return cpprun::DistributedDataParallel(net, dp);
  const int stage = how.back() - '0';
  auto each_block = [](const torch::nn::Module& m) { return dynamic_cast<const torch::nn::SequentialImpl*>(&m); };
  return cpprun::FullyShardedDataParallel(net, dp, cpprun::FsdpOptions().stage(stage).wrap_policy(each_block));
}

// Step `step`'s global batch: [dp * kPerReplica, kSequence, kHidden], inputs and targets.
std::pair<at::Tensor, at::Tensor> global_batch(int step) {
  torch::manual_seed(1000 + step);
  const int64_t batch = mesh().size("dp") * kPerReplica;
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  return {torch::randn({batch, kSequence, kHidden}, f64), torch::randn({batch, kSequence, kHidden}, f64)};
}

// This rank's part: its replica's rows, and with sequence parallelism its tensor-parallel slice of
// the sequence.
at::Tensor local_part(const at::Tensor& global, bool sequence_parallel) {
  at::Tensor rows = dist_test::slice(global, mesh().coordinate("dp"), mesh().size("dp"));
  return sequence_parallel ? rows.chunk(mesh().size("tp"), 1)[mesh().coordinate("tp")] : rows;
}

double relative(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-12); }

// The dropout masks of one replica's forward at one step: the same on every rank of its TP group
// (Note [Dropout's RNG rule]) and in the reference's forward of that replica's rows.
void seed_dropout(int step, int replica) { torch::manual_seed(5000 + 100 * step + replica); }

// One combination of the parity tests: the TP size (current_tp for its lifetime), the wrapper,
// sequence parallelism and activation checkpointing.
struct ParityCase {
  ParityCase(int tp, std::string how, bool sequence_parallel, bool checkpoint_blocks)
      : how(std::move(how)), sequence_parallel(sequence_parallel), checkpoint_blocks(checkpoint_blocks) {
    current_tp = tp;
  }
  ~ParityCase() { current_tp = 0; }
  // At dp 1 every ZeRO stage shards over one rank: DDP and ZeRO-3 cover {dp 1, tp 2 or 4}.
  bool redundant() const {
    return mesh().size("dp") == 1 && mesh().size("tp") > 1 && (how == "zero1" || how == "zero2");
  }
  std::string str() const {
    return how + " on {dp " + std::to_string(mesh().size("dp")) + ", tp " + std::to_string(mesh().size("tp")) + "}" +
           (sequence_parallel ? ", sequence parallel" : "") + (checkpoint_blocks ? ", checkpointed blocks" : "");
  }
  std::string how;
  bool sequence_parallel, checkpoint_blocks;
};

// One step's checks against the reference: this replica's `loss` (this rank's share of the
// sequence when `summed_over_tp`), averaged over the replicas, is the reference's, as is the
// clipped norm, which is above kMaxNorm so that the clipping acts.
void check_step(int step, const at::Tensor& loss, bool summed_over_tp, double reference_loss, double norm,
                double reference_norm) {
  at::Tensor whole_loss = loss.detach() / mesh().size("dp");
  cpprun::all_reduce(mesh().group("dp"), whole_loss);
  if (summed_over_tp) cpprun::all_reduce(mesh().group("tp"), whole_loss);
  INFO("step " << step << " loss " << whole_loss.item<double>() << " reference " << reference_loss << "; norm "
               << norm << " reference " << reference_norm);
  CHECK(reference_norm > kMaxNorm);
  CHECK(relative(whole_loss.item<double>(), reference_loss) <= kTolerance);
  CHECK(relative(norm, reference_norm) <= kTolerance);
}

// The trained model's parameters gathered whole under the unsplit names, which must be the
// reference's, name by name. Returns them.
template <typename Model, typename Reference>
torch::OrderedDict<std::string, at::Tensor> check_gathered_parameters(Model& model, Reference& reference) {
  model->gather_full_parameters();
  auto full = cpprun::tensor_parallel_full_state_dict(*model->module());
  const auto reference_params = reference->named_parameters();
  CHECK(full.size() == reference_params.size());
  for (const auto& item : reference_params) {
    INFO("parameter " << item.key());
    const at::Tensor* whole = full.find(item.key());
    REQUIRE(whole != nullptr);
    REQUIRE(whole->sizes() == item.value().sizes());
    CHECK(relative_difference(*whole, item.value()) <= kTolerance);
  }
  return full;
}

}  // namespace

TEST_CASE("tensor x data parallel: a Megatron block stack matches one process under DDP and ZeRO-1/2/3",
          "[tp2d]") {
  const int tp = GENERATE(from_range(parity_tp_sizes()));
  // ddp-list: DDP, clipped by cpprun::clip_grad_norm_(model->parameters()) (the split ones are
  // combined over the TP group, as the wrapper's clip_grad_norm does).
  const std::string how = GENERATE("ddp", "ddp-list", "zero1", "zero2", "zero3");
  const bool sequence_parallel = GENERATE(false, true);
  const bool checkpoint_blocks = GENERATE(false, true);
  const ParityCase parity(tp, how, sequence_parallel, checkpoint_blocks);
  if (parity.redundant()) return;
  INFO(parity.str());

  Stack reference(kBlocks), net(kBlocks);
  net->checkpoint_blocks = checkpoint_blocks;
  cpprun::parallelize_module(net.ptr(), mesh(), "tp", megatron_plan(sequence_parallel));
  auto model = wrap(how, net);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-2));
  torch::optim::AdamW reference_opt(reference->parameters(), torch::optim::AdamWOptions(1e-2));

  for (int step = 0; step < kSteps; ++step) {
    const auto [x, target] = global_batch(step);
    reference_opt.zero_grad();
    double reference_loss = 0;
    for (int replica = 0; replica < mesh().size("dp"); ++replica) {  // each replica's rows, its masks
      seed_dropout(step, replica);
      const auto rows = [&](const at::Tensor& t) { return dist_test::slice(t, replica, mesh().size("dp")); };
      at::Tensor loss = torch::mse_loss(reference->forward(rows(x)), rows(target), at::Reduction::Sum) / x.numel();
      loss.backward();
      reference_loss += loss.item<double>();
    }
    const double reference_norm = torch::nn::utils::clip_grad_norm_(reference->parameters(), kMaxNorm);
    reference_opt.step();

    opt.zero_grad();
    seed_dropout(step, mesh().coordinate("dp"));
    // Each replica's loss over its rows, scaled so that DP's average over replicas is the global
    // mean; with sequence parallelism each TP rank's covers its tokens (summed below to report).
    const at::Tensor out = model->forward(local_part(x, sequence_parallel));
    at::Tensor loss = torch::mse_loss(out, local_part(target, sequence_parallel), at::Reduction::Sum) /
                      (x.numel() / mesh().size("dp"));
    loss.backward();
    const double norm = how == "ddp-list" ? cpprun::clip_grad_norm_(model->parameters(), kMaxNorm)
                                          : model->clip_grad_norm(kMaxNorm);
    opt.step();

    check_step(step, loss, sequence_parallel, reference_loss, norm, reference_norm);
  }
  if (how.rfind("zero", 0) == 0) {  // FSDP's shards in a list stay refused, naming the wrapper's clip
    CHECK_THROWS_WITH(cpprun::clip_grad_norm_(model->parameters(), kMaxNorm),
                      Catch::Contains("model->clip_grad_norm(max_norm, norm_type)") &&
                          Catch::Contains("with tensor parallelism inside"));
  }

  // The gathered state dict: whole tensors under the unsplit names, as the reference's ...
  const auto full = check_gathered_parameters(model, reference);
  // ... which loads into an unsplit model, giving the reference's output.
  Stack unsplit(kBlocks);
  {
    at::NoGradGuard no_grad;
    for (auto& item : unsplit->named_parameters()) item.value().copy_(full[item.key()]);
  }
  const at::Tensor probe = global_batch(kSteps).first;
  unsplit->eval();  // no dropout
  reference->eval();
  CHECK(relative_difference(unsplit->forward(probe), reference->forward(probe)) <= kTolerance);
}

TEST_CASE("tensor x data parallel: a head tied to a vocabulary-parallel embedding matches one process", "[tp2d]") {
  const std::string how = GENERATE("ddp", "zero1", "zero2", "zero3");
  INFO(how << " on {dp " << mesh().size("dp") << ", tp " << mesh().size("tp") << "}");
  // Its head is its embedding, vocabulary-parallel across tp (tied_lm.h).
  tp_test::TiedLm reference, net;
  const auto whole_ids = cpprun::RowwiseParallel().input_layouts(cpprun::Replicate());
  cpprun::parallelize_module(net.ptr(), mesh(), "tp", {{"embed", whole_ids}});
  const auto& dp = mesh().group("dp");
  cpprun::DataParallel<tp_test::TiedLmImpl> model =
      how == "ddp" ? cpprun::DataParallel<tp_test::TiedLmImpl>(cpprun::DistributedDataParallel(net, dp))
                   : cpprun::DataParallel<tp_test::TiedLmImpl>(cpprun::FullyShardedDataParallel(
                         net, dp, cpprun::FsdpOptions().stage(how.back() - '0')));
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-2));
  torch::optim::AdamW reference_opt(reference->parameters(), torch::optim::AdamWOptions(1e-2));
  const int64_t batch = mesh().size("dp") * kPerReplica;
  for (int step = 0; step < kSteps; ++step) {
    torch::manual_seed(2000 + step);
    const at::Tensor ids = torch::randint(tp_test::TiedLmImpl::kVocab, {batch, kSequence});
    const at::Tensor target = torch::randint(tp_test::TiedLmImpl::kVocab, {batch, kSequence});
    reference_opt.zero_grad();
    const at::Tensor reference_loss =
        at::cross_entropy_loss(reference->forward(ids).flatten(0, 1), target.flatten(), {}, at::Reduction::Mean);
    reference_loss.backward();
    const double reference_norm = torch::nn::utils::clip_grad_norm_(reference->parameters(), kMaxNorm);
    reference_opt.step();

    opt.zero_grad();
    const auto rows = [&](const at::Tensor& t) {
      return dist_test::slice(t, mesh().coordinate("dp"), mesh().size("dp"));
    };
    const at::Tensor loss = cpprun::vocab_parallel_cross_entropy(model->forward(rows(ids)), rows(target),
                                                                 mesh().group("tp")).mean();
    loss.backward();
    const double norm = model->clip_grad_norm(kMaxNorm);
    opt.step();
    check_step(step, loss, false, reference_loss.item<double>(), norm, reference_norm);
  }
  check_gathered_parameters(model, reference);
}

TEST_CASE("tensor x data parallel: a GPT (attention, MLP, tied vocabulary-parallel head) matches one process",
          "[tp2d]") {
  const int tp = GENERATE(from_range(parity_tp_sizes()));
  const std::string how = GENERATE("ddp", "zero1", "zero2", "zero3");
  const bool sequence_parallel = GENERATE(false, true);
  const bool checkpoint_blocks = GENERATE(false, true);
  const ParityCase parity(tp, how, sequence_parallel, checkpoint_blocks);
  if (parity.redundant()) return;
  INFO(parity.str());

  tp_test::Gpt reference, net;
  net->checkpoint_blocks = checkpoint_blocks;
  cpprun::parallelize_module(net.ptr(), mesh(), "tp", tp_test::gpt_plan(*net, sequence_parallel));
  const auto& dp = mesh().group("dp");
  auto each_block = [](const torch::nn::Module& m) { return dynamic_cast<const tp_test::GptBlockImpl*>(&m); };
  cpprun::DataParallel<tp_test::GptImpl> model =
      how == "ddp" ? cpprun::DataParallel<tp_test::GptImpl>(cpprun::DistributedDataParallel(net, dp))
                   : cpprun::DataParallel<tp_test::GptImpl>(cpprun::FullyShardedDataParallel(
                         net, dp, cpprun::FsdpOptions().stage(how.back() - '0').wrap_policy(each_block)));
  // A smaller learning rate than the other cases': AdamW divides each element's step by its own
  // gradient's size, so where attention's gradients are small the summation order (the replicas'
  // halves against the whole batch) shows (in float32, at lr 1e-2, as 2e-5 even at tp 1). A wrong
  // gradient still moves a parameter by about lr per step, far past kTolerance.
  constexpr double kGptLr = 3e-3;
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(kGptLr));
  torch::optim::AdamW reference_opt(reference->parameters(), torch::optim::AdamWOptions(kGptLr));
  const int64_t batch = mesh().size("dp") * kPerReplica;

  for (int step = 0; step < kSteps; ++step) {
    torch::manual_seed(3000 + step);
    const at::Tensor ids = torch::randint(tp_test::GptImpl::kVocab, {batch, kGptSequence});
    const at::Tensor target = torch::randint(tp_test::GptImpl::kVocab, {batch, kGptSequence});
    const auto rows = [&](const at::Tensor& t, int replica) { return dist_test::slice(t, replica, mesh().size("dp")); };
    // The token mean over the global batch: each replica's rows sum their tokens' losses.
    const double tokens = static_cast<double>(target.numel());
    reference_opt.zero_grad();
    double reference_loss = 0;
    for (int replica = 0; replica < mesh().size("dp"); ++replica) {  // each replica's rows, its masks
      seed_dropout(step, replica);
      at::Tensor loss = at::cross_entropy_loss(reference->forward(rows(ids, replica)).flatten(0, 1),
                                               rows(target, replica).flatten(), {}, at::Reduction::Sum) / tokens;
      loss.backward();
      reference_loss += loss.item<double>();
    }
    const double reference_norm = torch::nn::utils::clip_grad_norm_(reference->parameters(), kMaxNorm);
    reference_opt.step();

    opt.zero_grad();
    seed_dropout(step, mesh().coordinate("dp"));
    const int replica = mesh().coordinate("dp");
    // The same on every rank of the TP group (the logits cover the whole sequence); scaled so that
    // DP's average over replicas is the global token mean.
    at::Tensor loss = cpprun::vocab_parallel_cross_entropy(model->forward(rows(ids, replica)), rows(target, replica),
                                                           mesh().group("tp")).sum() / (tokens / mesh().size("dp"));
    loss.backward();
    const double norm = model->clip_grad_norm(kMaxNorm);
    opt.step();

    check_step(step, loss, false, reference_loss, norm, reference_norm);
  }
  check_gathered_parameters(model, reference);
}

TEST_CASE("tensor x data parallel: an overflow on one rank's tensor-parallel shard skips the step everywhere",
          "[tp2d][grad_scaler]") {
  const std::string how = GENERATE("ddp", "zero2");
  INFO(how);
  const int world = group().size(), rank = group().rank();
  Stack net(kBlocks);
  cpprun::parallelize_module(net.ptr(), mesh(), "tp", megatron_plan(false));
  auto model = wrap(how, net);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-2));
  // Over the whole group: the flags of every dp and tp coordinate meet.
  cpprun::GradScaler scaler(group(), cpprun::GradScalerOptions().init_scale(1024));
  constexpr int kOverflowStep = 1;
  for (int step = 0; step < 3; ++step) {
    const auto [x, target] = global_batch(step);
    opt.zero_grad();
    scaler.scale(torch::mse_loss(model->forward(local_part(x, false)), local_part(target, false))).backward();
    if (step == kOverflowStep && rank == world - 1) {
      // The last rank alone, in its shard of a split weight, which no other rank holds.
      // (DDP registers the wrapped module as "module"; FSDP its shards under the module's names.)
      const auto params = model->named_parameters();
      at::Tensor grad = params[how == "ddp" ? "module.h.0.1.weight" : "h.0.1.weight"].grad();
      REQUIRE(grad.numel() > 0);
      grad.view(-1)[0] = std::numeric_limits<float>::infinity();
    }
    const bool stepped = scaler.step(opt);
    scaler.update();
    CHECK(stepped == (step != kOverflowStep));
  }
  CHECK(scaler.get_scale() == 512);
}

TEST_CASE("tensor x data parallel: a data-parallel group spanning a tensor-parallel group is refused",
          "[tp2d]") {
  if (mesh().size("tp") == 1) return;  // no two ranks share a tensor-parallel group
  Stack net(kBlocks);
  cpprun::parallelize_module(net.ptr(), mesh(), "tp", megatron_plan(false));
  const std::string expected = "in the same tensor-parallel group as this rank";
  CHECK_THROWS_WITH(cpprun::FullyShardedDataParallel(net, group()), Catch::Contains(expected) &&
                                                                        Catch::Contains("mesh.group(\"dp\")"));
  CHECK_THROWS_WITH(cpprun::DistributedDataParallel(net, group()), Catch::Contains(expected));
  CHECK_NOTHROW(cpprun::DistributedDataParallel(net, mesh().group("dp")));
}

// Note [One data-parallel wrapper per parameter]: a wrapper built first averaged nothing (DDP) or
// trained nothing (FSDP), and a save wrote one rank's part as the whole tensor.
TEST_CASE("tensor x data parallel: parallelize_module after a data-parallel wrapper is refused, naming the order",
          "[tp2d]") {
  const std::string order = "Parallelize first, then wrap";
  {
    Stack net(kBlocks);
    auto ddp = cpprun::DistributedDataParallel(net, mesh().group("dp"));
    CHECK_THROWS_WITH(cpprun::parallelize_module(net.ptr(), mesh(), "tp", megatron_plan(false)),
                      Catch::Contains("is held by a cpprun::DistributedDataParallel") && Catch::Contains(order));
  }
  {
    Stack net(kBlocks);
    auto fsdp = cpprun::FullyShardedDataParallel(net, mesh().group("dp"), cpprun::FsdpOptions().stage(3));
    CHECK_THROWS_WITH(cpprun::parallelize_module(net.ptr(), mesh(), "tp", megatron_plan(false)),
                      Catch::Contains("is held by a cpprun::FullyShardedDataParallel") && Catch::Contains(order));
  }
  // In that order, and with the earlier wrapper gone, it is taken.
  Stack net(kBlocks);
  { auto ddp = cpprun::DistributedDataParallel(net, mesh().group("dp")); }
  cpprun::parallelize_module(net.ptr(), mesh(), "tp", megatron_plan(false));
  CHECK_NOTHROW(cpprun::DistributedDataParallel(net, mesh().group("dp")));
}

TEST_CASE("tensor x data parallel: save_state_dict writes whole tensors, which load into any split", "[tp2d]") {
  // One directory for the job (MASTER_PORT is the job's own), every rank's files in it.
  const auto dir = std::filesystem::temp_directory_path() / ("cpprun_tp2d_" + std::string(std::getenv("MASTER_PORT")));
  if (group().rank() == 0) std::filesystem::create_directories(dir);
  struct RemoveAtEnd {  // also when a check throws
    std::filesystem::path dir;
    ~RemoveAtEnd() {
      std::error_code ignored;
      if (group().rank() == 0) std::filesystem::remove_all(dir, ignored);
    }
  } remove_at_end{dir};
  cpprun::barrier(group());
  const std::string path = (dir / "model.safetensors").string();

  // Trained a step under TP x ZeRO-3 so that every tensor differs from a fresh stack's.
  Stack net(kBlocks);
  cpprun::parallelize_module(net.ptr(), mesh(), "tp", megatron_plan(false));
  auto model = wrap("zero3", net);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-2));
  const auto [x, target] = global_batch(0);
  torch::mse_loss(model->forward(local_part(x, false)), local_part(target, false)).backward();
  opt.step();
  cpprun::save_state_dict(model, path);
  model->gather_full_parameters();
  const auto trained = cpprun::tensor_parallel_full_state_dict(*model->module());
  {
    // In memory too: get_model_state_dict gathers the same whole tensors on every rank, and
    // set_model_state_dict gives a fresh split stack under DDP its shards of them.
    const auto in_memory = cpprun::get_model_state_dict(model);
    Stack fresh(kBlocks);
    cpprun::parallelize_module(fresh.ptr(), mesh(), "tp", megatron_plan(true));
    auto fresh_ddp = wrap("ddp", fresh);
    cpprun::set_model_state_dict(fresh_ddp, in_memory);
    const auto set_whole = cpprun::tensor_parallel_full_state_dict(*fresh);
    for (const auto& item : trained) {
      INFO(item.key());
      CHECK(in_memory[item.key()].equal(item.value()));
      CHECK(set_whole[item.key()].equal(item.value()));
    }
  }

  // The file holds the whole tensors under the unsplit names: an unsplit stack loads it strictly.
  Stack unsplit(kBlocks);
  cpprun::load_state_dict(unsplit, path);
  for (const auto& item : unsplit->named_parameters()) {
    INFO(item.key());
    CHECK(item.value().equal(trained[item.key()]));
  }
  // A split stack under DDP (another wrapper, with sequence parallelism) and a plain split stack
  // load it too, each rank its shard, and a plain split stack saves the same file again.
  Stack again(kBlocks), plain(kBlocks);
  cpprun::parallelize_module(again.ptr(), mesh(), "tp", megatron_plan(true));
  cpprun::parallelize_module(plain.ptr(), mesh(), "tp", megatron_plan(false));
  auto ddp = wrap("ddp", again);
  cpprun::load_state_dict(ddp, path);
  cpprun::load_state_dict(plain, path);
  const auto loaded = cpprun::tensor_parallel_full_state_dict(*again);
  const auto loaded_plain = cpprun::tensor_parallel_full_state_dict(*plain);
  // ... and a fresh split stack under ZeRO-3, whose shards take the loaded values.
  Stack sharded(kBlocks);
  cpprun::parallelize_module(sharded.ptr(), mesh(), "tp", megatron_plan(false));
  auto zero3 = wrap("zero3", sharded);
  cpprun::load_state_dict(zero3, path);
  zero3->gather_full_parameters();
  const auto loaded_zero3 = cpprun::tensor_parallel_full_state_dict(*zero3->module());
  for (const auto& item : trained) {
    INFO(item.key());
    CHECK(loaded[item.key()].equal(item.value()));
    CHECK(loaded_plain[item.key()].equal(item.value()));
    CHECK(loaded_zero3[item.key()].equal(item.value()));
  }
  const std::string copy = (dir / "plain.pt").string();
  // A plain split model's save is collective over its TP group alone, whose first rank writes:
  // one replica's group saves (every replica's would write the same file at once).
  if (mesh().coordinate("dp") == 0) cpprun::save_state_dict(plain, copy);
  cpprun::barrier(group());
  Stack from_copy(kBlocks);
  cpprun::load_state_dict(from_copy, copy);
  for (const auto& item : from_copy->named_parameters()) CHECK(item.value().equal(trained[item.key()]));

  // A file that does not fit (one block, not two): refused on every rank, naming what is
  // missing, and nothing loaded; an unreadable file too.
  const std::string one_block = (dir / "one_block.safetensors").string();
  if (group().rank() == 0) {
    Stack small(1);
    cpprun::save_state_dict(small, one_block);  // plain, not split: rank 0 alone
  }
  cpprun::barrier(group());
  CHECK_THROWS_WITH(cpprun::load_state_dict(ddp, one_block), Catch::Contains("h.1.1.weight"));
  CHECK_THROWS_WITH(cpprun::load_state_dict(ddp, (dir / "missing.safetensors").string()),
                    Catch::Contains("missing.safetensors"));
  const auto unchanged = cpprun::tensor_parallel_full_state_dict(*again);
  for (const auto& item : trained) CHECK(unchanged[item.key()].equal(item.value()));

  // A sharded directory too: the writers (the first rank of each tensor-parallel group) write
  // their shares of the whole tensors, which load into an unsplit stack.
  const std::string directory = (dir / "sharded/").string();
  cpprun::save_state_dict(model, directory);
  Stack from_directory(kBlocks);
  cpprun::load_state_dict(from_directory, directory);
  for (const auto& item : from_directory->named_parameters()) CHECK(item.value().equal(trained[item.key()]));
  // The earlier format's TorchScript archive (save_full_state_dict) gathers the shards too: it is
  // the unsplit stack's torch::save, which an unsplit stack torch::loads.
  const std::string archive = (dir / "full.pt").string();
  cpprun::save_full_state_dict(model, archive);
  Stack from_archive(kBlocks);
  torch::load(from_archive, archive);
  for (const auto& item : from_archive->named_parameters()) {
    INFO(item.key());
    CHECK(item.value().equal(trained[item.key()]));
  }
  cpprun::barrier(group());  // every rank is done with the files before rank 0 removes them
}
