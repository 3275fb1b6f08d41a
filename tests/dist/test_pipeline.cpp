// Pipeline parallelism under `cpprun --nproc_per_node=K`, K = 1..4, the K ranks one pipeline:
// GPipe, 1F1B, zero bubble, Interleaved 1F1B and LoopedBFS (2 stages per rank) train a 14-child MLP split
// evenly (unevenly where 14 does not divide) for several AdamW steps with gradient clipping over
// the whole model, and must match one process training the unsplit model on the whole batch: the
// loss every rank gets from step(), the clipped norm, and every parameter by name. Micro-batch
// counts include fewer than the stages (the anchors' hang). Hidden layers under activation
// checkpointing train alike. A model built with deferred_init materialises only each rank's stage,
// with the unsplit model's values. At np2 and np4 two pipelines train on halves of the batch:
// through set_data_parallel_group, or with each stage wrapped by hand in DistributedDataParallel
// or FullyShardedDataParallel (ZeRO-1/2/3) on a {pp, dp, tp} mesh, its gradients reduced once a
// step; and with the hidden layers tensor-parallel in pairs over 2 ranks ({pp, tp 2}), clipped over
// both. A careless user's mistakes end in one
// error on every rank, and the schedule still runs the next step. All float64: the split and the
// reference differ only by summation order.
#include "catch.h"
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "cpprun/cpprun.h"
#include "ddp_test_models.h"
#include "parity_checks.h"
#include "dist_test_support.h"

using dist_test::error_of;
using dist_test::group;
using ddp_test::relative_difference;

namespace {

// Measured worst over every check at 1 to 4 ranks: printed per rank at the end of each case. A
// wrong gradient or a stage run twice moves a parameter by about the learning rate per step.
constexpr double kTolerance = ddp_test::kParityTolerance;  // 1e-10
constexpr int kSteps = 4;
constexpr int kBatch = 24;
constexpr double kMaxNorm = 0.3;

// Parameters are made in float64 directly (under ddp_test::Float64Parity), so that deferred_init
// records no conversion.
torch::nn::Sequential make_model() {
  torch::manual_seed(11);
  torch::nn::Sequential net;
  net->push_back("in", torch::nn::Linear(6, 16));
  for (int i = 0; i < 6; ++i) {
    net->push_back("act" + std::to_string(i), torch::nn::Tanh());
    net->push_back("h" + std::to_string(i), torch::nn::Linear(16, 16));
  }
  net->push_back("out", torch::nn::Linear(16, 3));
  return net;
}

at::Tensor mse(const at::Tensor& output, const at::Tensor& target) { return torch::mse_loss(output, target); }

// A hidden layer under activation checkpointing: recomputed in backward, inside its stage.
struct CheckpointedLayerImpl : torch::nn::Module {
  torch::nn::Linear linear{nullptr};
  explicit CheckpointedLayerImpl(int64_t width) : linear(register_module("linear", torch::nn::Linear(width, width))) {}
  at::Tensor forward(const at::Tensor& x) {
    auto layer = linear.ptr();
    return cpprun::checkpoint([layer](const at::Tensor& h) { return torch::tanh(layer->forward(h)); }, x);
  }
};
TORCH_MODULE(CheckpointedLayer);

torch::nn::Sequential make_checkpointed_model() {
  torch::manual_seed(12);
  torch::nn::Sequential net;
  net->push_back("in", torch::nn::Linear(6, 16));
  for (int i = 0; i < 6; ++i) net->push_back("h" + std::to_string(i), CheckpointedLayer(16));
  net->push_back("out", torch::nn::Linear(16, 3));
  return net;
}

// A language model whose head is its token embedding (as GPT-2's): split, the embedding lives on
// the first stage and the head on the last, two ranks' copies of one weight.
struct TiedHeadImpl : torch::nn::Module {
  at::Tensor weight;
  explicit TiedHeadImpl(const at::Tensor& embedding) { weight = register_parameter("weight", embedding); }
  at::Tensor forward(const at::Tensor& x) { return at::linear(x, weight); }
};
TORCH_MODULE(TiedHead);

constexpr int64_t kVocab = 20, kTokens = 5;
torch::nn::Sequential make_tied_lm() {
  torch::manual_seed(13);
  torch::nn::Sequential net;
  torch::nn::Embedding embed(kVocab, 8);
  net->push_back("embed", embed);
  for (int i = 0; i < 4; ++i) {
    net->push_back("h" + std::to_string(i), torch::nn::Linear(8, 8));
    net->push_back("act" + std::to_string(i), torch::nn::Tanh());
  }
  net->push_back("head", TiedHead(embed->weight));
  return net;
}

at::Tensor token_loss(const at::Tensor& logits, const at::Tensor& targets) {
  return torch::cross_entropy_loss(logits.flatten(0, 1), targets.flatten());
}

struct Batch {
  at::Tensor inputs, targets;
};
Batch batch_of(int step) {
  torch::manual_seed(100 + step);
  return {torch::randn({kBatch, 6}, torch::kDouble), torch::randn({kBatch, 3}, torch::kDouble)};
}

Batch token_batch_of(int step) {
  torch::manual_seed(200 + step);
  return {torch::randint(kVocab, {kBatch, kTokens}), torch::randint(kVocab, {kBatch, kTokens})};
}

// What a parity case trains: the model, its batches and its loss.
struct Task {
  torch::nn::Sequential (*make)();
  Batch (*batch)(int step);
  at::Tensor (*loss)(const at::Tensor&, const at::Tensor&);
};
const Task kMlp{make_model, batch_of, mse};
const Task kTiedLm{make_tied_lm, token_batch_of, token_loss};
const Task kCheckpointed{make_checkpointed_model, batch_of, mse};

struct Reference {
  std::vector<double> losses, norms;
  torch::nn::Sequential model;
};
Reference train_reference(const Task& task) {
  ddp_test::Float64Parity doubles;
  Reference ref{{}, {}, task.make()};
  const auto params = cpprun::unique_parameters(*ref.model);
  torch::optim::AdamW opt(params, torch::optim::AdamWOptions(1e-2));
  for (int s = 0; s < kSteps; ++s) {
    auto [x, y] = task.batch(s);
    opt.zero_grad();
    auto loss = task.loss(ref.model->forward(x), y);
    loss.backward();
    ref.norms.push_back(torch::nn::utils::clip_grad_norm_(params, kMaxNorm));
    ref.losses.push_back(loss.item<double>());
    opt.step();
  }
  return ref;
}

const Reference& reference(const Task& task = kMlp) {
  static const Reference mlp = train_reference(kMlp), tied = train_reference(kTiedLm),
                         checkpointed = train_reference(kCheckpointed);
  return &task == &kMlp ? mlp : &task == &kTiedLm ? tied : checkpointed;
}

enum class Kind { kGPipe, k1F1B, kInterleaved, kZeroBubble, kLoopedBFS };

// How the pipelines of a dp > 1 case are made data parallel: the schedule's
// set_data_parallel_group on a {dp, pp} mesh, or each stage wrapped by hand on a 3-d
// {pp, dp, tp 1} mesh, in DistributedDataParallel (with find_unused_parameters, too) or in
// FullyShardedDataParallel at ZeRO stage 1, 2 or 3. kTp: no data parallelism, but each stage's
// hidden layers tensor-parallel over 2 ranks ({pp, dp 1, tp 2}; dp must be 1). kTpWholeFirst: the
// same with 2 stages, the first holding only the (whole) input layer, so its ranks have no split
// gradient to sum while the second stage's do.
// kZero3Kept: ZeRO-3 with reshard_after_forward(false), its units gathered once a step.
// kHsdp2, kHsdp3: HSDP (ZeRO-2, ZeRO-3) on a {pp, rep 2, shard dp/2} mesh, each stage sharded over
// "shard" and replicated over "rep" (FullyShardedDataParallel over the submesh {rep, shard}).
enum class Wrap { kGroup, kDdp, kDdpFindUnused, kZero1, kZero2, kZero3, kZero3Kept, kTp, kTpWholeFirst, kHsdp2, kHsdp3 };
int zero_stage(Wrap wrap) {
  switch (wrap) {
    case Wrap::kZero1: return 1;
    case Wrap::kZero2:
    case Wrap::kHsdp2: return 2;
    case Wrap::kZero3:
    case Wrap::kZero3Kept:
    case Wrap::kHsdp3: return 3;
    default: return 0;
  }
}

// The all-gathers this process issued since the flight recorder's entries `since` (FSDP's
// parameter gathers: nothing else in these cases gathers), and the entries now.
int gathers_since(std::vector<cpprun::FlightRecorderEntry>& since) {
  auto now = cpprun::flight_recorder_entries();
  std::map<std::string, uint64_t> seen;  // per group, the last collective number already counted
  for (const auto& e : since) seen[e.group] = std::max(seen[e.group], e.seq);
  int count = 0;
  for (const auto& e : now) {
    if (e.op.find("gather") != std::string::npos && e.seq > seen[e.group]) ++count;
  }
  since = std::move(now);
  return count;
}

// The last send this process issued, as its group and number (only pipeline groups send here).
std::pair<std::string, uint64_t> last_send() {
  std::pair<std::string, uint64_t> last;
  for (const auto& e : cpprun::flight_recorder_entries()) {  // oldest first
    if (e.op == "send") last = {e.group, e.seq};
  }
  return last;
}

// DDP's own reduction (all-reduce, then divide), counting the buckets it is given and noting the
// last send issued before each.
class CountingHook : public cpprun::CommHook {
 public:
  cpprun::Work run(const cpprun::ProcessGroup& over, cpprun::GradBucket& bucket) override {
    ++calls;
    send_before_last_run = last_send();
    return inner_->run(over, bucket);
  }
  std::string name() const override { return "counting " + inner_->name(); }
  int calls = 0;
  std::pair<std::string, uint64_t> send_before_last_run;

 private:
  std::shared_ptr<cpprun::CommHook> inner_ = cpprun::allreduce_hook();
};

std::unique_ptr<cpprun::PipelineSchedule> make_schedule(Kind kind, std::vector<cpprun::PipelineStage>& stages,
                                                        int microbatches, const Task& task) {
  // By name, as train_gpt's --pp-schedule does: Kind's order.
  static const char* const kNames[] = {"gpipe", "1f1b", "interleaved-1f1b", "zero-bubble", "looped-bfs"};
  std::vector<cpprun::PipelineStage*> mine;
  for (auto& stage : stages) mine.push_back(&stage);
  return cpprun::make_schedule(kNames[static_cast<int>(kind)], mine, microbatches, task.loss);
}

// Trains kSteps under the pipeline; returns the largest relative difference from the reference.
// dp > 1: a {dp, pp} mesh, each pipeline on its share of the batch, gradients averaged across.
double train_and_compare(Kind kind, int microbatches, bool deferred = false, const Task& task = kMlp, int dp = 1,
                         Wrap wrap = Wrap::kGroup) {
  std::optional<cpprun::DeviceMesh> mesh;
  const int tp = wrap == Wrap::kTp || wrap == Wrap::kTpWholeFirst ? 2 : 1;
  const bool hsdp = wrap == Wrap::kHsdp2 || wrap == Wrap::kHsdp3;
  if (hsdp) {
    REQUIRE(dp % 2 == 0);
    mesh.emplace(group(), std::vector<int>{group().size() / dp, 2, dp / 2}, std::vector<std::string>{"pp", "rep", "shard"});
  } else if (dp > 1 && wrap == Wrap::kGroup) {
    mesh.emplace(group(), std::vector<int>{dp, group().size() / dp}, std::vector<std::string>{"dp", "pp"});
  } else if (dp > 1 || tp > 1) {
    mesh.emplace(group(), std::vector<int>{group().size() / (dp * tp), dp, tp}, std::vector<std::string>{"pp", "dp", "tp"});
  }
  const auto& pg = mesh ? mesh->group("pp") : group();
  const int p = pg.size(), v = kind == Kind::kInterleaved || kind == Kind::kLoopedBFS ? 2 : 1;
  ddp_test::Float64Parity doubles;
  torch::nn::Sequential model = deferred ? cpprun::deferred_init(task.make) : task.make();
  if (tp > 1) {
    // Megatron's pairs, h0 column-parallel and h1 row-parallel, ...: a stage boundary between the
    // two of a pair sends each TP rank's part of the activation to its peer in the next stage.
    cpprun::ParallelizePlan plan;
    for (int i = 0; i < 6; i += 2) {
      plan.push_back({"h" + std::to_string(i), cpprun::ColwiseParallel()});
      plan.push_back({"h" + std::to_string(i + 1), cpprun::RowwiseParallel()});
    }
    cpprun::parallelize_module(model.ptr(), *mesh, "tp", plan);
  }
  auto split = cpprun::split_evenly(model, p * v);
  if (wrap == Wrap::kTpWholeFirst) {
    REQUIRE((p == 2 && v == 1));
    split = {{"in", "act0"}, {}};
    for (const auto& child : model->named_children()) {
      if (child.key() != "in" && child.key() != "act0") split[1].push_back(child.key());
    }
  }
  std::vector<cpprun::PipelineStage> stages;
  for (int k = 0; k < v; ++k) stages.emplace_back(model, split, pg, pg.rank() + k * p);
  std::vector<std::shared_ptr<CountingHook>> hooks;  // one per stage in DDP
  size_t fsdp_buckets = 0;                            // of this rank's stages in FSDP: one gather each
  if (mesh && wrap != Wrap::kGroup && tp == 1) {
    for (auto& stage : stages) {
      if (zero_stage(wrap) > 0) {
        // One unit per layer (units resharded after forward are gathered again in backward); with
        // reshard_after_forward(false) every unit of the stage may stay gathered.
        auto options = cpprun::FsdpOptions().stage(zero_stage(wrap)).wrap_policy([](const torch::nn::Module& m) {
          return dynamic_cast<const torch::nn::LinearImpl*>(&m) != nullptr;
        });
        if (wrap == Wrap::kZero3Kept) options.reshard_after_forward(false).gathered_unit_limit(64);
        cpprun::FullyShardedDataParallel<torch::nn::SequentialImpl> fsdp =
            hsdp ? cpprun::FullyShardedDataParallel<torch::nn::SequentialImpl>(stage.module(),
                                                                             mesh->submesh({"rep", "shard"}), options)
                 : cpprun::FullyShardedDataParallel<torch::nn::SequentialImpl>(stage.module(), mesh->group("dp"), options);
        fsdp_buckets += fsdp->bucket_count();
        stage.set_data_parallel(fsdp);
        continue;
      }
      cpprun::DistributedDataParallel<torch::nn::SequentialImpl> ddp(
          stage.module(), mesh->group("dp"),
          cpprun::DdpOptions().find_unused_parameters(wrap == Wrap::kDdpFindUnused));
      hooks.push_back(std::make_shared<CountingHook>());
      ddp->register_comm_hook(hooks.back());
      stage.set_data_parallel(ddp);
      CHECK_THROWS_WITH(stage.set_data_parallel(ddp), Catch::Contains("already wrapped"));
    }
  }
  // What the optimizer steps (FSDP: this rank's shards).
  std::vector<at::Tensor> params;
  std::set<const c10::TensorImpl*> seen;  // a weight two of this rank's stages share: once
  for (auto& stage : stages) {
    for (const auto& t : stage.parameters()) {
      if (seen.insert(t.unsafeGetTensorImpl()).second) params.push_back(t);
    }
  }
  if (deferred) {
    // Only this rank's stages got memory.
    int materialised = 0, left = 0;
    for (const auto& t : cpprun::unique_parameters(*model)) (cpprun::is_deferred(t) ? left : materialised) += 1;
    CHECK(materialised == static_cast<int>(params.size()));
    if (p > 1) CHECK(left > 0);
  }
  auto schedule = make_schedule(kind, stages, microbatches, task);
  if (mesh && wrap == Wrap::kGroup) schedule->set_data_parallel_group(mesh->group("dp"));
  // This pipeline's rows of each batch (all of them without data parallelism).
  const int dp_index = !mesh || dp == 1 ? 0 : hsdp ? mesh->coordinate("rep") * (dp / 2) + mesh->coordinate("shard")
                                                   : mesh->coordinate("dp");
  auto share = [&](const at::Tensor& t) { return dp > 1 ? dist_test::slice(t, dp_index, dp) : t; };
  torch::optim::AdamW opt(params, torch::optim::AdamWOptions(1e-2));
  double worst = 0;
  const auto& ref = reference(task);
  auto recorded = cpprun::flight_recorder_entries();
  for (int s = 0; s < kSteps; ++s) {
    auto [x, y] = task.batch(s);
    opt.zero_grad();
    gathers_since(recorded);
    const double loss = schedule->step(share(x), share(y)).item<double>();
    // ZeRO-3 kept gathered: each unit gathered once a step (its first forward), not per micro-batch;
    // resharded after forward, again for later micro-batches.
    const int gathers = gathers_since(recorded);
    if (wrap == Wrap::kZero3Kept) CHECK(gathers == static_cast<int>(fsdp_buckets));
    if (wrap == Wrap::kZero3 && microbatches > 1) CHECK(gathers > static_cast<int>(fsdp_buckets));
    std::vector<cpprun::PipelineStage*> mine;
    for (auto& stage : stages) mine.push_back(&stage);
    const double norm = cpprun::pipeline_clip_grad_norm(mine, kMaxNorm);
    opt.step();
    worst = std::max({worst, std::abs(loss - ref.losses[s]) / ref.losses[s], std::abs(norm - ref.norms[s]) / ref.norms[s]});
    // One reduction of the stage's (one-bucket) gradients a step, not one per micro-batch.
    for (const auto& hook : hooks) CHECK(hook->calls == s + 1);
    // ... started in the stage's last backward, before the gradient it sends back: the reduction
    // overlaps the rest of the step (Note [A pipeline stage's last backward]). Zero bubble's split
    // backwards reduce at the step's end.
    if (p > 1 && v == 1 && pg.rank() > 0 && kind != Kind::kZeroBubble) {
      for (const auto& hook : hooks) CHECK(hook->send_before_last_run != last_send());
    }
    REQUIRE(static_cast<int>(schedule->microbatch_losses().size()) == microbatches);
    // The activations held at once: GPipe all (LoopedBFS all of each of its stages), 1F1B p - r,
    // interleaved its warm-up plus one;
    // zero bubble (each held until its weight pass, which runs when the rank would wait) from
    // 1F1B's p - r up to 1F1B's first rank's p.
    const int r = pg.rank(), m = microbatches;
    const int per_round = m / std::max(1, m / p);  // interleaved's rounds, as PyTorch's
    const int warmup = m == p ? m * v : std::min(m * v, (p - r - 1) * 2 + (v - 1) * per_round);
    const int expected_held = kind == Kind::kGPipe         ? m
                              : kind == Kind::kLoopedBFS   ? m * v
                              : kind == Kind::kInterleaved ? std::min(warmup + 1, m * v)
                                                           : std::min(p - r, m);
    const auto& stats = schedule->last_step_stats();
    if (kind == Kind::kZeroBubble) {
      CHECK(stats.peak_held >= expected_held);
      CHECK(stats.peak_held <= std::min(p, m));
    } else {
      CHECK(stats.peak_held == expected_held);
    }
    CHECK((stats.seconds > 0 && stats.waiting_seconds >= 0 && stats.waiting_seconds <= stats.seconds));
  }
  // Evaluation: forwards only, the trained reference's loss on a held-out batch, on every rank.
  {
    auto [x, y] = task.batch(99);
    const double held_out = schedule->eval(share(x), share(y)).item<double>();
    torch::NoGradGuard no_grad;
    torch::nn::Sequential trained = ref.model;  // a handle: forward is not const
    const double expected = task.loss(trained->forward(x), y).item<double>();
    worst = std::max(worst, std::abs(held_out - expected) / expected);
  }
  // FSDP: the full parameters from the shards the optimizer stepped (collective over dp).
  for (auto& stage : stages) {
    if (!stage.data_parallel().is_empty()) stage.data_parallel().ptr()->gather_full_parameters();
  }
  auto ref_params = ref.model->named_parameters();
  int compared = 0;
  std::set<const c10::TensorImpl*> compared_tensors;
  for (const auto& stage : stages) {
    const auto splits = cpprun::tensor_parallel_splits(*stage.module());
    for (const auto& item : stage.module()->named_parameters()) {
      at::Tensor expected = ref_params[item.key()];
      if (auto split = splits.find(item.key()); split != splits.end()) {  // this TP rank's chunk (no fused parts here)
        const auto& [over, dim, parts] = split->second;
        REQUIRE(parts == 1);
        const int64_t chunk = expected.size(dim) / over.size();
        expected = expected.narrow(dim, over.rank() * chunk, chunk);
      }
      worst = std::max(worst, relative_difference(item.value(), expected));
      compared_tensors.insert(item.value().unsafeGetTensorImpl());
      ++compared;
    }
  }
  CHECK(compared_tensors.size() == params.size());
  CHECK(compared >= static_cast<int>(params.size()));
  INFO("rank " << pg.rank() << " worst relative difference " << worst);
  CHECK(worst < kTolerance);
  return worst;
}

}  // namespace

TEST_CASE("pipeline: the reference clips, so the parity checks clipping", "[pipeline]") {
  const auto& ref = reference();
  CHECK(*std::max_element(ref.norms.begin(), ref.norms.end()) > kMaxNorm);
}

TEST_CASE("pipeline: GPipe matches one process, with fewer micro-batches than stages too", "[pipeline][pipeline_schedules]") {
  double worst = 0;
  for (int m : {1, 2, 4, 8}) worst = std::max(worst, train_and_compare(Kind::kGPipe, m));
  std::printf("pipeline GPipe rank %d: worst relative difference %.2e\n", group().rank(), worst);
}

TEST_CASE("pipeline: 1F1B matches one process, with fewer micro-batches than stages too", "[pipeline][pipeline_schedules]") {
  double worst = 0;
  for (int m : {1, 3, 4, 8}) worst = std::max(worst, train_and_compare(Kind::k1F1B, m));
  std::printf("pipeline 1F1B rank %d: worst relative difference %.2e\n", group().rank(), worst);
}

TEST_CASE("pipeline: zero bubble (backward split into input and weight passes) matches one process", "[pipeline][pipeline_schedules]") {
  double worst = 0;
  for (int m : {1, 3, 4, 8}) worst = std::max(worst, train_and_compare(Kind::kZeroBubble, m));
  worst = std::max(worst, train_and_compare(Kind::kZeroBubble, 4, /*deferred=*/false, kTiedLm));
  worst = std::max(worst, train_and_compare(Kind::kZeroBubble, 4, /*deferred=*/true));
  std::printf("pipeline ZeroBubble rank %d: worst relative difference %.2e\n", group().rank(), worst);
}

TEST_CASE("pipeline: activation checkpointing inside the stages matches one process", "[pipeline]") {
  double worst = 0;
  for (Kind kind : {Kind::kGPipe, Kind::k1F1B, Kind::kZeroBubble}) {
    worst = std::max(worst, train_and_compare(kind, 4, /*deferred=*/false, kCheckpointed));
  }
  worst = std::max(worst, train_and_compare(Kind::kInterleaved, group().size(), /*deferred=*/false, kCheckpointed));
  std::printf("pipeline checkpointed rank %d: worst relative difference %.2e\n", group().rank(), worst);
}

TEST_CASE("pipeline: Interleaved 1F1B with 2 stages per rank matches one process", "[pipeline][pipeline_schedules]") {
  const int p = group().size();
  double worst = 0;
  for (int m : {p, 2 * p}) worst = std::max(worst, train_and_compare(Kind::kInterleaved, m));
  // PyTorch's rounds where p does not divide m: one round of m (m < 2p), or rounds of m / rounds
  // (p + 2 is the one the batch of 24 divides at 4 ranks: 6 micro-batches in one round).
  for (int m : {p + 1, p + 2, 2 * p + 2}) {
    if (m % p != 0 && kBatch % m == 0 && m % std::max(1, m / p) == 0) {
      worst = std::max(worst, train_and_compare(Kind::kInterleaved, m));
    }
  }
  std::printf("pipeline Interleaved1F1B rank %d: worst relative difference %.2e\n", group().rank(), worst);
}

TEST_CASE("pipeline: LoopedBFS with 2 stages per rank matches one process", "[pipeline][pipeline_schedules]") {
  const int p = group().size();
  double worst = 0;
  // Any number of micro-batches (fewer than the ranks too), the tied model, checkpointed layers,
  // and two pipelines of ZeRO-3 stages.
  for (int m : {1, 3, 2 * p}) worst = std::max(worst, train_and_compare(Kind::kLoopedBFS, m));
  worst = std::max(worst, train_and_compare(Kind::kLoopedBFS, 2, /*deferred=*/false, kTiedLm));
  worst = std::max(worst, train_and_compare(Kind::kLoopedBFS, 2, /*deferred=*/false, kCheckpointed));
  if (p % 2 == 0) {
    worst = std::max(worst, train_and_compare(Kind::kLoopedBFS, 3, false, kMlp, /*dp=*/2, Wrap::kZero3));
  }
  std::printf("pipeline LoopedBFS rank %d: worst relative difference %.2e\n", group().rank(), worst);
}

TEST_CASE("pipeline: a deferred model materialises only this rank's stage, with the unsplit values", "[pipeline]") {
  train_and_compare(Kind::k1F1B, 4, /*deferred=*/true);
  // The random generator ends where eager construction of the whole model leaves it.
  ddp_test::Float64Parity doubles;
  make_model();
  const at::Tensor after_eager = torch::rand({8});
  auto deferred = cpprun::deferred_init(make_model);
  cpprun::PipelineStage stage(deferred, cpprun::split_evenly(deferred, group().size()), group());
  CHECK(torch::equal(torch::rand({8}), after_eager));
}

TEST_CASE("pipeline: a head tied to the embedding across stages trains as the unsplit model", "[pipeline]") {
  double worst = 0;
  for (int m : {1, 4}) {
    worst = std::max(worst, train_and_compare(Kind::k1F1B, m, /*deferred=*/false, kTiedLm));
    worst = std::max(worst, train_and_compare(Kind::kGPipe, m, /*deferred=*/false, kTiedLm));
  }
  worst = std::max(worst, train_and_compare(Kind::kInterleaved, group().size(), /*deferred=*/false, kTiedLm));
  worst = std::max(worst, train_and_compare(Kind::k1F1B, 4, /*deferred=*/true, kTiedLm));
  std::printf("pipeline tied rank %d: worst relative difference %.2e\n", group().rank(), worst);
}

TEST_CASE("pipeline: step() twice before the optimizer accumulates as two backwards of one process, a tied "
          "weight too", "[pipeline]") {
  // Without zero_grad between them, each step's gradients add to the last's (loss.backward()'s
  // rule). A tie's sum over its holders once counted the earlier step's gradient again.
  ddp_test::Float64Parity doubles;
  for (const Task* task : {&kTiedLm, &kMlp}) {
    torch::nn::Sequential whole = task->make();
    for (int s = 0; s < 2; ++s) {
      auto [x, y] = task->batch(s);
      task->loss(whole->forward(x), y).backward();
    }
    auto expected = whole->named_parameters();
    for (Kind kind : {Kind::k1F1B, Kind::kGPipe, Kind::kZeroBubble}) {
      torch::nn::Sequential model = task->make();
      std::vector<cpprun::PipelineStage> stages;
      stages.emplace_back(model, cpprun::split_evenly(model, group().size()), group());
      auto schedule = make_schedule(kind, stages, 4, *task);
      for (int s = 0; s < 2; ++s) {
        auto [x, y] = task->batch(s);
        schedule->step(x, y);
      }
      for (const auto& item : stages[0].module()->named_parameters()) {
        INFO("schedule " << static_cast<int>(kind) << ", " << item.key() << ", rank " << group().rank());
        REQUIRE(item.value().grad().defined());
        CHECK(relative_difference(item.value().grad(), expected[item.key()].grad()) < kTolerance);
      }
    }
  }
}

TEST_CASE("pipeline: a frozen tied weight gets no gradient and stays, as in one process; frozen on some of its "
          "holders, it is refused on every rank", "[pipeline]") {
  // AdamW over every parameter, the tied embedding/head frozen: one process leaves its gradient
  // undefined and the optimizer skips it. The pipeline once gave each holder a zero gradient to sum,
  // and AdamW's weight decay moved the frozen weight.
  ddp_test::Float64Parity doubles;
  auto frozen_lm = [] {
    torch::nn::Sequential model = make_tied_lm();
    model->named_parameters()["embed.weight"].requires_grad_(false);
    return model;
  };
  torch::nn::Sequential whole = frozen_lm();
  {
    torch::optim::AdamW opt(cpprun::unique_parameters(*whole), torch::optim::AdamWOptions(1e-2));
    for (int s = 0; s < 2; ++s) {
      auto [x, y] = token_batch_of(s);
      opt.zero_grad();
      token_loss(whole->forward(x), y).backward();
      opt.step();
    }
  }
  auto expected = whole->named_parameters();
  const at::Tensor initial = make_tied_lm()->named_parameters()["embed.weight"];
  for (Kind kind : {Kind::k1F1B, Kind::kGPipe, Kind::kZeroBubble}) {
    torch::nn::Sequential model = frozen_lm();
    std::vector<cpprun::PipelineStage> stages;
    stages.emplace_back(model, cpprun::split_evenly(model, group().size()), group());
    auto schedule = make_schedule(kind, stages, 4, kTiedLm);
    torch::optim::AdamW opt(stages[0].parameters(), torch::optim::AdamWOptions(1e-2));
    for (int s = 0; s < 2; ++s) {
      auto [x, y] = token_batch_of(s);
      opt.zero_grad();
      schedule->step(x, y);
      opt.step();
    }
    for (const auto& item : stages[0].module()->named_parameters()) {
      INFO("schedule " << static_cast<int>(kind) << ", " << item.key() << ", rank " << group().rank());
      CHECK(relative_difference(item.value(), expected[item.key()]) < kTolerance);
      if (!item.value().requires_grad()) {
        CHECK_FALSE(item.value().grad().defined());
        CHECK(torch::equal(item.value(), initial));
      }
    }
  }
  const int p = group().size();
  if (p == 1) return;  // one rank holds the tie whole: one tensor
  // Frozen on the last stage's rank alone (it holds the head): no holder may sum while another
  // does not, so every rank refuses, naming the tie and the ranks.
  torch::nn::Sequential model = make_tied_lm();
  cpprun::PipelineStage stage(model, cpprun::split_evenly(model, p), group());
  if (group().rank() == p - 1) model->named_parameters()["head.weight"].requires_grad_(false);
  cpprun::Schedule1F1B schedule(stage, 4, token_loss);
  auto [x, y] = token_batch_of(0);
  CHECK_THAT(error_of([&] { schedule.step(x, y); }),
             Catch::Contains("the tied weight stage 0's embed.weight, stage " + std::to_string(p - 1) +
                             "'s head.weight is frozen (requires_grad false) on pipeline rank(s) " +
                             std::to_string(p - 1) + " but trained on rank(s) 0"));
  // Frozen on every holder, the same schedule runs.
  model->named_parameters()["embed.weight"].requires_grad_(false);
  CHECK(std::isfinite(schedule.step(x, y).item<double>()));
}

// A layer whose pre-activation's gradient a tensor hook doubles (as a user's gradient scaling).
struct HookedLayerImpl : torch::nn::Module {
  torch::nn::Linear linear{nullptr};
  HookedLayerImpl() : linear(register_module("linear", torch::nn::Linear(16, 16))) {}
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = linear->forward(x);
    if (h.requires_grad()) h.register_hook([](const at::Tensor& g) { return g * 2; });
    return torch::tanh(h);
  }
};
TORCH_MODULE(HookedLayer);

TEST_CASE("pipeline: a tensor hook inside a stage runs once a backward under zero bubble too", "[pipeline]") {
  // Zero bubble's weight pass started the engine at the node whose output carries the hook, which
  // ran it again: the hooked layer's weight gradient came out doubled twice (PyTorch 2.15's too).
  ddp_test::Float64Parity doubles;
  auto make = [] {
    torch::manual_seed(14);
    torch::nn::Sequential net;
    net->push_back("in", torch::nn::Linear(6, 16));
    net->push_back("act0", torch::nn::Tanh());
    for (int i = 0; i < 3; ++i) net->push_back("hooked" + std::to_string(i), HookedLayer());
    net->push_back("out", torch::nn::Linear(16, 3));
    return net;
  };
  auto [x, y] = batch_of(0);
  torch::nn::Sequential whole = make();
  mse(whole->forward(x), y).backward();
  auto expected = whole->named_parameters();
  for (Kind kind : {Kind::kZeroBubble, Kind::k1F1B}) {
    torch::nn::Sequential model = make();
    std::vector<cpprun::PipelineStage> stages;
    stages.emplace_back(model, cpprun::split_evenly(model, group().size()), group());
    make_schedule(kind, stages, 4, kMlp)->step(x, y);
    for (const auto& item : stages[0].module()->named_parameters()) {
      INFO("schedule " << static_cast<int>(kind) << ", " << item.key() << ", rank " << group().rank());
      CHECK(relative_difference(item.value().grad(), expected[item.key()].grad()) < kTolerance);
    }
  }
}

TEST_CASE("pipeline: {dp 2, pp} averages the stages' gradients across pipelines as one process", "[pipeline]") {
  if (group().size() % 2 != 0) return;  // np1, np3: no such mesh (np2: dp 2 x pp 1, np4: dp 2 x pp 2)
  double worst = 0;
  worst = std::max(worst, train_and_compare(Kind::k1F1B, 3, false, kMlp, /*dp=*/2));
  worst = std::max(worst, train_and_compare(Kind::kGPipe, 2, false, kTiedLm, /*dp=*/2));
  worst = std::max(worst, train_and_compare(Kind::kZeroBubble, 4, false, kMlp, /*dp=*/2));
  worst = std::max(worst, train_and_compare(Kind::kInterleaved, group().size() / 2, false, kTiedLm, /*dp=*/2));
  std::printf("pipeline dp 2 rank %d: worst relative difference %.2e\n", group().rank(), worst);
}

TEST_CASE("pipeline: stages wrapped in DistributedDataParallel on a {pp, dp, tp} mesh reduce once a step and match "
          "one process", "[pipeline]") {
  if (group().size() % 2 != 0) return;  // np1, np3: no such mesh (np2: pp 1 x dp 2, np4: pp 2 x dp 2)
  double worst = 0;
  worst = std::max(worst, train_and_compare(Kind::k1F1B, 3, false, kMlp, /*dp=*/2, Wrap::kDdp));
  worst = std::max(worst, train_and_compare(Kind::kGPipe, 2, false, kTiedLm, /*dp=*/2, Wrap::kDdp));
  worst = std::max(worst, train_and_compare(Kind::kZeroBubble, 4, false, kTiedLm, /*dp=*/2, Wrap::kDdpFindUnused));
  worst = std::max(worst, train_and_compare(Kind::kInterleaved, group().size() / 2, false, kMlp, /*dp=*/2, Wrap::kDdp));
  std::printf("pipeline ddp stages rank %d: worst relative difference %.2e\n", group().rank(), worst);
}

TEST_CASE("pipeline: stages in FullyShardedDataParallel (ZeRO-1, 2, 3) on a {pp, dp, tp} mesh match one process",
          "[pipeline]") {
  if (group().size() % 2 != 0) return;  // np1, np3: no such mesh (np2: pp 1 x dp 2, np4: pp 2 x dp 2)
  double worst = 0;
  worst = std::max(worst, train_and_compare(Kind::k1F1B, 3, false, kMlp, /*dp=*/2, Wrap::kZero1));
  worst = std::max(worst, train_and_compare(Kind::kGPipe, 2, false, kTiedLm, /*dp=*/2, Wrap::kZero2));
  worst = std::max(worst, train_and_compare(Kind::k1F1B, 4, false, kTiedLm, /*dp=*/2, Wrap::kZero3));
  worst = std::max(worst, train_and_compare(Kind::kZeroBubble, 4, false, kMlp, /*dp=*/2, Wrap::kZero3));
  worst = std::max(worst, train_and_compare(Kind::kZeroBubble, 2, false, kCheckpointed, /*dp=*/2, Wrap::kZero2));
  worst = std::max(worst, train_and_compare(Kind::kInterleaved, group().size() / 2, false, kMlp, /*dp=*/2, Wrap::kZero3));
  worst = std::max(worst, train_and_compare(Kind::k1F1B, 4, false, kTiedLm, /*dp=*/2, Wrap::kZero3Kept));
  worst = std::max(worst, train_and_compare(Kind::kZeroBubble, 4, false, kMlp, /*dp=*/2, Wrap::kZero3Kept));
  worst = std::max(worst, train_and_compare(Kind::kInterleaved, group().size() / 2, false, kMlp, /*dp=*/2, Wrap::kZero3Kept));
  std::printf("pipeline fsdp stages rank %d: worst relative difference %.2e\n", group().rank(), worst);
}

TEST_CASE("pipeline: stages in HSDP ({pp, rep 2, shard}) match one process", "[pipeline][pipeline_hsdp]") {
  // np4: one stage over {rep 2, shard 2}; np8 (dist.pipeline.hsdp.np8): two stages, each over its
  // own {rep 2, shard 2}, the tied head's gradients summed between stages sharded alike.
  if (group().size() != 4 && group().size() != 8) return;
  double worst = 0;
  // Each pipeline trains on 6 of the batch's 24 rows.
  worst = std::max(worst, train_and_compare(Kind::k1F1B, 3, false, kTiedLm, /*dp=*/4, Wrap::kHsdp3));
  worst = std::max(worst, train_and_compare(Kind::kZeroBubble, 2, false, kMlp, /*dp=*/4, Wrap::kHsdp2));
  worst = std::max(worst, train_and_compare(Kind::kGPipe, 6, false, kMlp, /*dp=*/4, Wrap::kHsdp3));
  std::printf("pipeline hsdp stages rank %d: worst relative difference %.2e\n", group().rank(), worst);
}

TEST_CASE("pipeline: tensor-parallel layers inside the stages ({pp, tp 2}) match one process, clipped over both",
          "[pipeline]") {
  if (group().size() % 2 != 0) return;  // np1, np3: no such mesh (np2: pp 1 x tp 2, np4: pp 2 x tp 2)
  double worst = 0;
  worst = std::max(worst, train_and_compare(Kind::k1F1B, 3, false, kMlp, /*dp=*/1, Wrap::kTp));
  worst = std::max(worst, train_and_compare(Kind::kGPipe, 2, false, kMlp, /*dp=*/1, Wrap::kTp));
  worst = std::max(worst, train_and_compare(Kind::kZeroBubble, 4, false, kMlp, /*dp=*/1, Wrap::kTp));
  worst = std::max(worst, train_and_compare(Kind::kInterleaved, group().size() / 2, false, kMlp, /*dp=*/1, Wrap::kTp));
  if (group().size() == 4) worst = std::max(worst, train_and_compare(Kind::k1F1B, 4, false, kMlp, 1, Wrap::kTpWholeFirst));
  std::printf("pipeline tp stages rank %d: worst relative difference %.2e\n", group().rank(), worst);
}

TEST_CASE("pipeline: a stage's data-parallel wrapper must be its own, and set once", "[pipeline]") {
  ddp_test::Float64Parity doubles;
  torch::nn::Sequential model = make_model();
  const auto split = cpprun::split_evenly(model, group().size());
  cpprun::PipelineStage stage(model, split, group());
  // Each rank alone: the ranks' stages differ, and no wrapper here is meant to communicate.
  const cpprun::ProcessGroup alone = cpprun::split_group(group(), group().rank());
  torch::nn::Sequential other = make_model();
  CHECK_THROWS_WITH(stage.set_data_parallel(cpprun::DistributedDataParallel(other, alone)),
                    Catch::Contains("wraps another module"));
  CHECK(stage.data_parallel().is_empty());
}

TEST_CASE("pipeline: a GradScaler over the pipeline skips the step on every stage when one overflows", "[pipeline]") {
  // Each rank holds only its stage's gradients: an overflow shows on one rank alone, and the
  // scaler's agreement over the pipeline group makes every stage skip that step (or none).
  const auto& pg = group();
  ddp_test::Float64Parity doubles;
  auto model = make_model();
  cpprun::PipelineStage stage(model, cpprun::split_evenly(model, pg.size()), pg);
  cpprun::Schedule1F1B schedule(stage, 4, mse);
  torch::optim::SGD opt(stage.parameters(), 0.1);
  cpprun::GradScaler scaler(pg, cpprun::GradScalerOptions().init_scale(1024));
  schedule.set_grad_scaler(scaler);
  auto [x, y] = batch_of(0);
  // The gradients without scaling, to see the scaled ones unscaled exactly (float64, a power of 2).
  cpprun::Schedule1F1B plain(stage, 4, mse);
  opt.zero_grad();
  plain.step(x, y);
  std::vector<at::Tensor> unscaled;
  for (const auto& p : stage.parameters()) unscaled.push_back(p.grad().clone());
  const int overflowing = pg.size() - 1;  // the last stage's rank
  for (bool overflow : {false, true}) {
    INFO("overflow on rank " << overflowing << ": " << overflow);
    opt.zero_grad();
    const double loss = schedule.step(x, y).item<double>();
    CHECK(loss == Approx(reference().losses[0]).epsilon(1e-12));  // the first step's loss, unscaled
    for (size_t k = 0; k < unscaled.size(); ++k) CHECK(torch::equal(stage.parameters()[k].grad(), 1024 * unscaled[k]));
    if (overflow && pg.rank() == overflowing) stage.parameters()[0].mutable_grad()[0].fill_(INFINITY);
    std::vector<at::Tensor> before;
    for (const auto& p : stage.parameters()) before.push_back(p.detach().clone());
    const bool stepped = scaler.step(opt);
    scaler.update();
    CHECK(stepped == !overflow);
    for (size_t k = 0; k < before.size(); ++k) CHECK(torch::equal(before[k], stage.parameters()[k]) == overflow);
    if (!overflow) {  // stepped on the unscaled gradients
      for (size_t k = 0; k < unscaled.size(); ++k) CHECK(torch::equal(stage.parameters()[k].grad(), unscaled[k]));
    }
    if (!overflow) {  // undo the step, so that the second pass starts from the same weights
      torch::NoGradGuard no_grad;
      for (size_t k = 0; k < before.size(); ++k) stage.parameters()[k].copy_(before[k]);
    }
  }
  CHECK(scaler.get_scale() == 512);  // backed off once, on every rank
}

// PyTorch's scale_grads=False: the gradients of the micro-batch losses' sum, m times the mean's
// (exact in float64: m a power of 2); step() still returns the mean.
TEST_CASE("pipeline: set_scale_grads(false) gives the sum's gradients, as PyTorch's scale_grads=False", "[pipeline]") {
  const auto& pg = group();
  ddp_test::Float64Parity doubles;
  auto model = make_model();
  cpprun::PipelineStage stage(model, cpprun::split_evenly(model, pg.size()), pg);
  cpprun::Schedule1F1B mean(stage, 4, mse), sum(stage, 4, mse);
  sum.set_scale_grads(false);
  auto [x, y] = batch_of(0);
  for (const auto& p : stage.parameters()) p.mutable_grad() = at::Tensor();
  const double mean_loss = mean.step(x, y).item<double>();
  std::vector<at::Tensor> of_mean;
  for (const auto& p : stage.parameters()) of_mean.push_back(p.grad().clone());
  for (const auto& p : stage.parameters()) p.mutable_grad() = at::Tensor();
  CHECK(sum.step(x, y).item<double>() == mean_loss);
  for (size_t k = 0; k < of_mean.size(); ++k) CHECK(torch::equal(stage.parameters()[k].grad(), 4 * of_mean[k]));
}

TEST_CASE("pipeline: clipping some of a rank's stages is refused on every rank", "[pipeline]") {
  // Two stages per rank: the last rank clipping one of them (stage.clip_grad_norm on each in turn)
  // clipped each by a part of the norm, silently; every rank refuses it now, as the checkpoint
  // calls do, and a stage given twice too.
  const auto& pg = group();
  const int p = pg.size();
  ddp_test::Float64Parity doubles;
  auto model = make_model();
  const auto split = cpprun::split_evenly(model, 2 * p);
  cpprun::PipelineStage a(model, split, pg, pg.rank()), b(model, split, pg, pg.rank() + p);
  cpprun::ScheduleInterleaved1F1B schedule({&a, &b}, p, mse);
  auto [x, y] = batch_of(0);
  schedule.step(x, y);
  const bool last = pg.rank() == p - 1;
  const std::string partial = "this rank holds 2 of the split's " + std::to_string(2 * p) + " stages, but 1 were given";
  CHECK_THAT(error_of([&] { last ? a.clip_grad_norm(kMaxNorm) : cpprun::pipeline_clip_grad_norm({&a, &b}, kMaxNorm); }),
             Catch::Contains(partial));
  const std::vector<cpprun::PipelineStage*> twice = last ? std::vector{&a, &a} : std::vector{&a, &b};
  CHECK_THAT(error_of([&] { cpprun::pipeline_clip_grad_norm(twice, kMaxNorm); }),
             Catch::Contains("stage " + std::to_string(p - 1) + " is given twice"));
  // Nothing was clipped: every stage given, the norm is the whole model's, unclipped before.
  std::vector<at::Tensor> grads;
  for (auto* stage : {&a, &b}) {
    for (const auto& t : stage->parameters()) grads.push_back(t.grad());
  }
  const double norm = cpprun::pipeline_clip_grad_norm({&a, &b}, 1e9);
  at::Tensor squares = at::zeros({}, at::kDouble);
  for (const auto& g : grads) squares += g.pow(2).sum();
  cpprun::all_reduce(pg, squares);
  CHECK(std::abs(norm - std::sqrt(squares.item<double>())) < 1e-12 * norm);
}

TEST_CASE("pipeline: a careless user's mistakes are one error on every rank", "[pipeline]") {
  const auto& pg = group();
  const int p = pg.size();
  ddp_test::Float64Parity doubles;
  auto model = make_model();
  const auto split = cpprun::split_evenly(model, p);
  std::vector<cpprun::PipelineStage> stages{cpprun::PipelineStage(model, split, pg)};
  cpprun::Schedule1F1B schedule(stages[0], 4, mse);
  auto [x, y] = batch_of(0);
  // A batch that does not split into the micro-batches, on every rank alike.
  CHECK_THAT(error_of([&] { schedule.step(x.narrow(0, 0, 10), y.narrow(0, 0, 10)); }),
             Catch::Contains("batch of 10 rows does not split into 4 micro-batches"));
  // The first stage's rank forgot the inputs: every rank says so, naming the stage and rank.
  CHECK_THAT(error_of([&] { schedule.step(pg.rank() == 0 ? at::Tensor() : x, y); }),
             Catch::Contains("pipeline stage 0 (rank 0) was given no inputs"));
  CHECK_THAT(error_of([&] { schedule.eval(x, at::Tensor()); }), Catch::Contains("targets (or a 0-dimensional tensor) "
                                                                                "in eval()"));
  // A stage that cannot take its input (float32 into the float64 model) is named with its
  // micro-batch. At one rank only: with more, the error is the first stage's alone, and the
  // others would wait for its messages (see docs/pipeline_parallel.md's traps).
  if (p == 1) {
    CHECK_THAT(error_of([&] { schedule.step(x.to(at::kFloat), y); }),
               Catch::Contains("pipeline stage 0 (rank 0): the forward of micro-batch 0 failed (its input "
                               "Float[6, 6])"));
    // A loss function's own exception (not a c10::Error) is named alike, its message kept and the
    // exception itself nested, as PyTorch's `raise ... from e`.
    cpprun::Schedule1F1B refusing(stages[0], 4, [](const at::Tensor&, const at::Tensor&) -> at::Tensor {
      throw std::runtime_error("this loss refuses");
    });
    bool nested_kept = false;
    try {
      refusing.step(x, y);
    } catch (const c10::Error& e) {
      CHECK_THAT(e.what_without_backtrace(),
                 Catch::Contains("pipeline stage 0 (rank 0): the loss function of micro-batch 0 failed (its input "
                                 "Double[6, 6]): this loss refuses"));
      try {
        std::rethrow_if_nested(e);
      } catch (const std::runtime_error& original) {
        nested_kept = std::string(original.what()) == "this loss refuses";
      }
    }
    CHECK(nested_kept);
  }
  // eval() on rank 0 alone (to log) while the others train: every rank says which ranks ran which,
  // rather than all of them waiting out the group's timeout.
  if (p > 1) {
    std::string others;
    for (int r = 1; r < p; ++r) others += (r > 1 ? ", " : "") + std::to_string(r);
    CHECK_THAT(error_of([&] { pg.rank() == 0 ? schedule.eval(x, y) : schedule.step(x, y); }),
               Catch::Contains("the pipeline's ranks called different things: pipeline rank(s) " + others +
                               " step() and rank(s) 0 eval()"));
  }
  // In a {dp 2, pp} mesh the second pipeline's stage 0 is the job's rank p / 2: named so, and by its
  // pipeline rank (the pipeline rank alone named another process than the logs show).
  if (p == 4) {
    cpprun::DeviceMesh mesh(pg, {2, 2}, {"dp", "pp"});
    auto half = make_model();
    cpprun::PipelineStage stage(half, cpprun::split_evenly(half, 2), mesh.group("pp"));
    cpprun::Schedule1F1B two(stage, 4, mse);
    const bool second = mesh.coordinate("dp") == 1;
    CHECK_THAT(error_of([&] { two.step(stage.is_first() ? at::Tensor() : x, y); }),
               Catch::Contains(second ? "pipeline stage 0 (rank 2, pipeline rank 0) was given no inputs"
                                      : "pipeline stage 0 (rank 0) was given no inputs"));
  }
  // The schedule still runs a correct step afterwards: the reference's first loss.
  const double loss = schedule.step(x, y).item<double>();
  CHECK(std::abs(loss - reference().losses[0]) / reference().losses[0] < kTolerance);
  CHECK_THAT(error_of([&] { cpprun::PipelineStage(model, split, pg, -2); }),
             Catch::Contains("stage_index -2 is not a stage"));
  // Splits that do not fit the pipeline.
  CHECK_THAT(error_of([&] { cpprun::PipelineStage(model, cpprun::split_evenly(model, p + 1), pg); }),
             p == 1 ? Catch::Contains("stage_index") : Catch::Contains("ranks do not divide"));
  if (p > 1) {
    CHECK_THAT(error_of([&] { cpprun::PipelineStage(model, split, pg, (pg.rank() + 1) % p); }),
               Catch::Contains("not on this rank"));
    auto two_per_rank = cpprun::split_evenly(model, 2 * p);
    cpprun::PipelineStage a(model, two_per_rank, pg, pg.rank()), b(model, two_per_rank, pg, pg.rank() + p);
    // 2p + 1 micro-batches: two rounds (PyTorch's max(1, m / p)) that do not divide them.
    CHECK_THAT(error_of([&] { cpprun::ScheduleInterleaved1F1B({&a, &b}, 2 * p + 1, mse); }),
               Catch::Contains(std::to_string(2 * p + 1) + " micro-batches is not a multiple of 2"));
    CHECK_THAT(error_of([&] { cpprun::Schedule1F1B(a, 4, mse); }), Catch::Contains("1F1B runs one stage per rank"));
    CHECK_THAT(error_of([&] { cpprun::make_schedule("1f1b", {&a, &b}, 4, mse); }),
               Catch::Contains("1F1B runs one stage per rank, but 2 were given"));
    // The last rank given another split, or another number of micro-batches: every rank refuses,
    // naming it (Note [One schedule on every pipeline rank]). Another split ran a layer twice and
    // gave a wrong loss silently; another count waited out the group's timeout.
    auto moved = split;  // stage 0's last child moved to stage 1
    moved[1].insert(moved[1].begin(), moved[0].back());
    moved[0].pop_back();
    REQUIRE_FALSE(moved[0].empty());
    cpprun::PipelineStage odd(model, pg.rank() == p - 1 ? moved : split, pg);
    const std::string last = "; rank " + std::to_string(p - 1) + " 1F1B over 4 micro-batches, split ";
    CHECK_THAT(error_of([&] { cpprun::Schedule1F1B(odd, 4, mse); }),
               Catch::Contains("the pipeline's ranks were given different schedules") && Catch::Contains(last));
    CHECK_THAT(error_of([&] { cpprun::Schedule1F1B(stages[0], pg.rank() == p - 1 ? 8 : 4, mse); }),
               Catch::Contains("rank " + std::to_string(p - 1) + " 1F1B over 8 micro-batches"));
    // One rank's own mistake (a name that names no schedule, no loss function) is refused on every
    // rank: the others, given a good schedule, waited in the exchange until the group's timeout.
    const bool last_rank = pg.rank() == p - 1;
    const std::string refused = "the pipeline's rank " + std::to_string(p - 1) + " refused its schedule, so every "
                                "rank does: ";
    CHECK_THAT(error_of([&] { cpprun::make_schedule(last_rank ? "1f1c" : "1f1b", {&stages[0]}, 4, mse); }),
               Catch::Contains(last_rank ? std::string("cpprun::make_schedule: no schedule is named \"1f1c\"")
                                         : refused + "cpprun::make_schedule: no schedule is named \"1f1c\""));
    CHECK_THAT(error_of([&] { cpprun::Schedule1F1B(stages[0], 4, last_rank ? nullptr : mse); }),
               Catch::Contains(last_rank ? std::string("1F1B: a loss function is needed")
                                         : refused + "1F1B: a loss function"));
  }
  // A schedule by a name that names none: the error lists those that exist.
  CHECK_THAT(error_of([&] { cpprun::make_schedule("zb", {&stages[0]}, 4, mse); }),
             Catch::Contains("no schedule is named \"zb\"") && Catch::Contains("interleaved-1f1b"));
  // One of PyTorch's that cpprun lacks is named as such; PyTorch's zero bubble builds cpprun's.
  CHECK_THAT(error_of([&] { cpprun::make_schedule("ZBVZeroBubble", {&stages[0]}, 4, mse); }),
             Catch::Contains("PyTorch's ScheduleZBVZeroBubble is not implemented in cpprun") &&
                 Catch::Contains("interleaved-1f1b"));
  CHECK(dynamic_cast<cpprun::ScheduleZeroBubble*>(
            cpprun::make_schedule("InterleavedZeroBubble", {&stages[0]}, 4, mse).get()) != nullptr);
  CHECK_THAT(error_of([&] { cpprun::Schedule1F1B(stages[0], 0, mse); }), Catch::Contains("at least one micro-batch"));
}
