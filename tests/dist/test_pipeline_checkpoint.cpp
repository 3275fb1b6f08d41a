// Checkpoints of pipeline stages (cpprun/pipeline_state_dict.h) under `cpprun --nproc_per_node=K`,
// K = 1..4: the stages of a model save together the unsplit model's checkpoint (a .safetensors
// file, a .pt file, a sharded directory) and load it back cut another way, under another
// {pp, dp, tp} layout. With the optimizer: a run stopped after two steps, its model and AdamW
// state saved by the stages, resumes cut another way (in FSDP too) or unsplit in one process, and
// an unsplit run's checkpoint resumes in stages, each to the parameters of the uninterrupted
// unsplit run (float64, 1e-10: the layouts differ by summation order only), with a head tied
// across the first and last stages too. The model's values are its seeded ones plus a distinct offset per tensor,
// set before any split or wrapper, so that every save and load is checked exactly (copies only)
// against the same offsets applied to an unsplit model: a tensor from the wrong stage, rank or
// row, or not loaded, differs by at least 1e-3.
#include "catch.h"
#include <torch/torch.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "cpprun/cpprun.h"
#include "cpprun/pipeline_state_dict.h"
#include "checkpoint_test_support.h"
#include "dist_test_support.h"
#include "parity_checks.h"

using dist_test::error_of;
using dist_test::group;

namespace {

namespace fs = std::filesystem;

// 14 children, as the schedule tests' MLP; float64 (under ddp_test::Float64Parity).
torch::nn::Sequential make_mlp(int width = 16) {
  torch::manual_seed(21);
  torch::nn::Sequential net;
  net->push_back("in", torch::nn::Linear(6, width));
  for (int i = 0; i < 6; ++i) {
    net->push_back("act" + std::to_string(i), torch::nn::Tanh());
    net->push_back("h" + std::to_string(i), torch::nn::Linear(width, width));
  }
  net->push_back("out", torch::nn::Linear(width, 3));
  return net;
}

// The head is the token embedding, as GPT-2's: on the first and the last stage.
struct TiedHeadImpl : torch::nn::Module {
  at::Tensor weight;
  explicit TiedHeadImpl(const at::Tensor& embedding) { weight = register_parameter("weight", embedding); }
  at::Tensor forward(const at::Tensor& x) { return at::linear(x, weight); }
};
TORCH_MODULE(TiedHead);

// The tied LM's modules but its head: its state dict holds the tie under "embed.weight" only.
struct HeadlessImpl : torch::nn::Module {
  explicit HeadlessImpl(const torch::nn::Sequential& lm) {
    for (const auto& child : lm->named_children()) {
      if (child.key() != "head") register_module(child.key(), child.value());
    }
  }
};

torch::nn::Sequential make_tied_lm() {
  torch::manual_seed(22);
  torch::nn::Sequential net;
  torch::nn::Embedding embed(20, 8);
  net->push_back("embed", embed);
  for (int i = 0; i < 4; ++i) net->push_back("h" + std::to_string(i), torch::nn::Linear(8, 8));
  net->push_back("head", TiedHead(embed->weight));
  return net;
}

// Tensor k of the model (parameters' order) gets (k + 1) * 1e-3 added: the same on every rank.
void offset(torch::nn::Sequential& model) {
  torch::NoGradGuard no_grad;
  int k = 0;
  for (auto& p : cpprun::unique_parameters(*model)) p.add_(++k * 1e-3);
}

std::map<std::string, at::Tensor> named(const torch::nn::Module& module) {
  std::map<std::string, at::Tensor> out;
  for (const auto& item : module.named_parameters()) out[item.key()] = item.value().detach().clone();
  return out;
}

struct JobDirectory {
  JobDirectory() : path(fs::temp_directory_path() / ("cpprun_pp_ckpt_" + std::string(std::getenv("MASTER_PORT")))) {
    if (group().rank() == 0) fs::create_directories(path);
    cpprun::barrier(group());
  }
  ~JobDirectory() {
    cpprun::barrier(group());
    std::error_code ignored;
    if (group().rank() == 0) fs::remove_all(path, ignored);
  }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
  fs::path path;
};

// A pipeline over the job: `pp` stages a pipeline (v per rank), with dp copies of each in FSDP
// (ZeRO `zero`) or its hidden layers tensor-parallel over tp ranks; dp = tp = 1: the job is one
// pipeline.
struct Layout {
  int dp = 1, tp = 1, zero = 0, v = 1;
  bool reversed_split = false;  // the later stages get the extra children
  int split_layers = 6;         // with tp: h0 .. h(split_layers - 1) tensor-parallel, the others whole
  bool told_tp_group = false;   // every stage's set_tensor_parallel_group(mesh.group("tp"))
};

struct Pipeline {
  torch::nn::Sequential model;
  std::optional<cpprun::DeviceMesh> mesh;
  std::vector<cpprun::PipelineStage> stages;
  std::vector<cpprun::PipelineStage*> mine() {
    std::vector<cpprun::PipelineStage*> out;
    for (auto& s : stages) out.push_back(&s);
    return out;
  }
  const cpprun::ProcessGroup& pipeline_group() const { return mesh ? mesh->group("pp") : group(); }
};

Pipeline build(torch::nn::Sequential model, const Layout& layout) {
  Pipeline out{std::move(model), std::nullopt, {}};
  const int pp = group().size() / (layout.dp * layout.tp);
  if (layout.dp > 1 || layout.tp > 1) {
    out.mesh.emplace(group(), std::vector<int>{pp, layout.dp, layout.tp}, std::vector<std::string>{"pp", "dp", "tp"});
  }
  if (layout.tp > 1) {
    cpprun::ParallelizePlan plan;
    for (int i = 0; i < layout.split_layers; i += 2) {
      plan.push_back({"h" + std::to_string(i), cpprun::ColwiseParallel()});
      plan.push_back({"h" + std::to_string(i + 1), cpprun::RowwiseParallel()});
    }
    cpprun::parallelize_module(out.model.ptr(), *out.mesh, "tp", plan);
  }
  const auto& pg = out.pipeline_group();
  auto split = cpprun::split_evenly(out.model, pg.size() * layout.v);
  if (layout.reversed_split) {
    // The stage sizes in reverse (the first stages get fewer children), the children in order.
    std::reverse(split.begin(), split.end());
    std::vector<std::string> children;
    for (const auto& child : out.model->named_children()) children.push_back(child.key());
    std::size_t at = 0;
    for (auto& stage : split) {
      const std::size_t count = stage.size();
      stage.assign(children.begin() + static_cast<long>(at), children.begin() + static_cast<long>(at + count));
      at += count;
    }
  }
  for (int k = 0; k < layout.v; ++k) out.stages.emplace_back(out.model, split, pg, pg.rank() + k * pg.size());
  if (layout.told_tp_group) {
    for (auto& stage : out.stages) stage.set_tensor_parallel_group(out.mesh->group("tp"));
  }
  if (layout.zero > 0) {
    for (auto& stage : out.stages) {
      auto options = cpprun::FsdpOptions().stage(layout.zero).wrap_policy(
          [](const torch::nn::Module& m) { return dynamic_cast<const torch::nn::LinearImpl*>(&m) != nullptr; });
      stage.set_data_parallel(
          cpprun::FullyShardedDataParallel<torch::nn::SequentialImpl>(stage.module(), out.mesh->group("dp"), options));
    }
  }
  return out;
}

// Every parameter of the rank's stages against `expected` (the unsplit model's), exactly (or
// within `tolerance`, relative to the tensor's largest magnitude): this rank's chunk of a
// tensor-parallel one; FSDP's full parameters gathered first.
void check_stages(Pipeline& pipeline, const std::map<std::string, at::Tensor>& expected, double tolerance = 0) {
  for (auto& stage : pipeline.stages) {
    if (!stage.data_parallel().is_empty()) stage.data_parallel().ptr()->gather_full_parameters();
  }
  int compared = 0;
  for (auto& stage : pipeline.stages) {
    const auto splits = cpprun::tensor_parallel_splits(*stage.module());
    for (const auto& item : stage.module()->named_parameters()) {
      at::Tensor want = expected.at(item.key());
      if (auto split = splits.find(item.key()); split != splits.end()) {
        const auto& [over, dim, parts] = split->second;
        const int64_t chunk = want.size(dim) / over.size();
        want = want.narrow(dim, over.rank() * chunk, chunk);
      }
      INFO("stage " << stage.index() << " " << item.key());
      if (tolerance == 0) {
        CHECK(at::equal(item.value(), want));
      } else {
        CHECK((item.value() - want).abs().max().item<double>() <= tolerance * want.abs().max().item<double>());
      }
      ++compared;
    }
  }
  CHECK(compared > 0);
}

// The checkpoint at PATH loaded into an unsplit model alone, against `expected`.
void check_unsplit(torch::nn::Sequential (*make)(int), const std::string& path,
                   const std::map<std::string, at::Tensor>& expected) {
  torch::nn::Sequential plain = make(16);
  cpprun::load_state_dict(plain, path);  // strict: every name, shape and dtype
  for (const auto& [name, tensor] : named(*plain)) {
    INFO(name);
    CHECK(at::equal(tensor, expected.at(name)));
  }
}

torch::nn::Sequential mlp(int width) { return make_mlp(width); }
torch::nn::Sequential offset_mlp(int width = 16) {
  auto model = make_mlp(width);
  offset(model);
  return model;
}

}  // namespace

TEST_CASE("pipeline checkpoint: the stages save the unsplit model's file, which loads at another split",
          "[pipeline_checkpoint]") {
  ddp_test::Float64Parity doubles;
  JobDirectory dir;
  const auto expected = named(*offset_mlp());
  for (const std::string file : {"model.safetensors", "model.pt", "sharded/"}) {
    INFO(file);
    {
      Pipeline saved = build(offset_mlp(), {});
      cpprun::save_state_dict(saved.mine(), dir / file, cpprun::StateDictSaveOptions().step(3));
    }
    check_unsplit(mlp, dir / file, expected);
    Pipeline loaded = build(make_mlp(), {.reversed_split = true});
    const auto report = cpprun::load_state_dict(loaded.mine(), dir / file);
    CHECK(report.missing_keys.empty());
    CHECK(report.unexpected_keys.empty());
    check_stages(loaded, expected);
    cpprun::barrier(group());  // read everywhere before the next save replaces it
  }
  // The sharded directory holds one file per stage (its tensors only), and the index names all.
  if (group().rank() == 0) {
    int shards = 0;
    for (const auto& entry : fs::directory_iterator(dir.path / "sharded")) {
      shards += entry.path().filename().string().rfind("model-", 0) == 0;
    }
    CHECK(shards == std::min(group().size(), 14));
  }
}

TEST_CASE("pipeline checkpoint: an unsplit model's checkpoint loads into stages, interleaved too",
          "[pipeline_checkpoint]") {
  ddp_test::Float64Parity doubles;
  JobDirectory dir;
  const auto expected = named(*offset_mlp());
  if (group().rank() == 0) {
    auto whole = offset_mlp();
    cpprun::save_state_dict(whole, dir / "whole/");
  }
  cpprun::barrier(group());
  Pipeline loaded = build(make_mlp(), {.v = 2});
  cpprun::load_state_dict(loaded.mine(), dir / "whole/");
  check_stages(loaded, expected);
  // Interleaved: every stage of the rank, or the checkpoint would lack the others.
  const std::string error = [&] {
    try {
      cpprun::save_state_dict(loaded.stages[0], dir / "one.safetensors");
    } catch (const c10::Error& e) {
      return std::string(e.what_without_backtrace());
    }
    return std::string();
  }();
  CHECK_THAT(error, Catch::Contains("pass every stage this rank holds"));
}

TEST_CASE("pipeline checkpoint: a GPT-like head tied across the first and last stages saves under both names",
          "[pipeline_checkpoint]") {
  ddp_test::Float64Parity doubles;
  JobDirectory dir;
  auto reference = make_tied_lm();
  offset(reference);
  const auto expected = named(*reference);
  auto model = make_tied_lm();
  offset(model);
  Pipeline saved = build(model, {});
  cpprun::save_state_dict(saved.mine(), dir / "tied.safetensors");
  auto plain = make_tied_lm();
  cpprun::load_state_dict(plain, dir / "tied.safetensors");
  CHECK(at::equal(plain->named_parameters()["embed.weight"], expected.at("embed.weight")));
  Pipeline loaded = build(make_tied_lm(), {});
  cpprun::load_state_dict(loaded.mine(), dir / "tied.safetensors");
  check_stages(loaded, expected);
  // A file holding the tie under its first name only, as Hugging Face's GPT-2 files hold theirs:
  // loaded strict(false), the last stage's copy of the head is filled from the embedding the file
  // held, as the unsplit model's one tensor is; both report the head's name missing. In FSDP
  // ZeRO-3 stages too, where the ranks are even.
  if (group().rank() == 0) cpprun::save_state_dict(std::make_shared<HeadlessImpl>(reference), dir / "headless.safetensors");
  cpprun::barrier(group());
  const auto lenient = cpprun::StateDictOptions().strict(false);
  auto unsplit = make_tied_lm();
  CHECK(cpprun::load_state_dict(unsplit, dir / "headless.safetensors", lenient).missing_keys ==
        std::vector<std::string>{"head.weight"});
  CHECK(at::equal(unsplit->named_parameters()["head.weight"], expected.at("embed.weight")));
  std::vector<Layout> layouts = {{}};
  if (group().size() % 2 == 0) layouts.push_back({.dp = 2, .zero = 3});
  for (const Layout& layout : layouts) {
    INFO("dp " << layout.dp << " ZeRO-" << layout.zero);
    Pipeline headless = build(make_tied_lm(), layout);
    const auto report = cpprun::load_state_dict(headless.mine(), dir / "headless.safetensors", lenient);
    CHECK(report.missing_keys == std::vector<std::string>{"head.weight"});
    CHECK(report.unexpected_keys.empty());
    check_stages(headless, expected);
  }
}

TEST_CASE("pipeline checkpoint: a file whose tied names hold different values is refused on every rank, as the "
          "unsplit model refuses it", "[pipeline_checkpoint]") {
  // The embedding and the head on different ranks' stages: each rank read only its own name of the
  // file, so each copy loaded its own value, and they stayed apart.
  ddp_test::Float64Parity doubles;
  JobDirectory dir;
  if (group().rank() == 0) {
    auto tied = make_tied_lm();
    torch::nn::Sequential untied;  // the same names, head.weight = embed.weight + 1
    const auto names = tied->named_children().keys();
    for (std::size_t i = 0; i + 1 < tied->size(); ++i) {  // every child but the head
      untied->push_back(names[i], *(tied->begin() + i));
    }
    untied->push_back("head", TiedHead(tied->named_parameters()["embed.weight"].detach().clone() + 1));
    cpprun::save_state_dict(untied, dir / "untied.safetensors");
    cpprun::save_state_dict(untied, dir / "untied/");
  }
  cpprun::barrier(group());
  const std::string refused = "\"embed.weight\" and \"head.weight\" with different values, but the module ties "
                              "them (one tensor under both names), so it cannot load both; nothing was loaded.";
  for (const std::string& path : {dir / "untied.safetensors", dir / "untied/"}) {
    INFO(path);
    auto plain = make_tied_lm();
    CHECK_THROWS_WITH(cpprun::load_state_dict(plain, path), Catch::Contains(refused));
    Pipeline pipeline = build(make_tied_lm(), {});
    const auto before = named(*make_tied_lm());
    CHECK_THROWS_AS(cpprun::load_state_dict(pipeline.mine(), path), cpprun::StateDictMismatchError);
    CHECK_THROWS_WITH(cpprun::load_state_dict(pipeline.mine(), path), Catch::Contains(refused));
    check_stages(pipeline, before);
  }
  // A copy of another dtype is not "different values": it does not fit the module, and the load
  // says so by name, as the unsplit model's does (the digests compared the dtype too, and said
  // "different values" of a float32 copy of the same numbers).
  const std::string float32_head = dir / "float32_head.safetensors";
  if (group().rank() == 0) {
    auto tied = make_tied_lm();
    torch::nn::Sequential untied;  // the same names and numbers, head.weight in float32
    const auto names = tied->named_children().keys();
    for (std::size_t i = 0; i + 1 < tied->size(); ++i) untied->push_back(names[i], *(tied->begin() + i));
    untied->push_back("head", TiedHead(tied->named_parameters()["embed.weight"].detach().to(at::kFloat)));
    cpprun::save_state_dict(untied, float32_head);
  }
  cpprun::barrier(group());
  const auto refusal_of = [](const std::function<void()>& load) -> std::string {
    try {
      load();
    } catch (const cpprun::StateDictMismatchError& e) {
      return e.what();
    }
    return "";
  };
  auto plain = make_tied_lm();
  const std::string plain_refusal = refusal_of([&] { cpprun::load_state_dict(plain, float32_head); });
  CHECK_THAT(plain_refusal, Catch::Contains("head.weight: file float32 [20, 8], module float64"));
  Pipeline pipeline = build(make_tied_lm(), {});
  const auto before = named(*make_tied_lm());
  const std::string refusal = refusal_of([&] { cpprun::load_state_dict(pipeline.mine(), float32_head); });
  CHECK_THAT(refusal, Catch::Contains("head.weight: file float32 [20, 8], module float64"));
  CHECK_THAT(refusal, !Catch::Contains("different values"));
  check_stages(pipeline, before);
  // strict(false): the copy that fits loads, and the tie's other copy takes its value, as the
  // unsplit model's one tensor (they were left apart for good, the head keeping its own value).
  Pipeline moved = build(make_tied_lm(), {});
  {
    at::NoGradGuard no_grad;
    for (auto& stage : moved.stages) {
      for (auto& p : stage.module()->parameters()) p.add_(1);
    }
  }
  const auto lenient = cpprun::load_state_dict(moved.mine(), float32_head, cpprun::StateDictOptions().strict(false));
  CHECK(lenient.mismatched.size() == 1);
  auto plain_lenient = make_tied_lm();
  {
    at::NoGradGuard no_grad;
    for (auto& p : plain_lenient->parameters()) p.add_(1);
  }
  cpprun::load_state_dict(plain_lenient, float32_head, cpprun::StateDictOptions().strict(false));
  check_stages(moved, named(*plain_lenient));
}

TEST_CASE("pipeline checkpoint: {pp, dp} FSDP and {pp, tp} stages save and load across layouts",
          "[pipeline_checkpoint]") {
  if (group().size() % 2 != 0) return;  // np1, np3: no even layout (the cases above ran)
  ddp_test::Float64Parity doubles;
  JobDirectory dir;
  const auto expected = named(*offset_mlp());
  for (const int zero : {1, 3}) {
    for (const std::string file : {"fsdp.safetensors", "fsdp/"}) {
      INFO("ZeRO-" << zero << " " << file);
      {
        Pipeline saved = build(offset_mlp(), {.dp = 2, .zero = zero});
        cpprun::save_state_dict(saved.mine(), dir / file);
      }
      check_unsplit(mlp, dir / file, expected);
      Pipeline plain = build(make_mlp(), {});  // every rank a stage
      cpprun::load_state_dict(plain.mine(), dir / file);
      check_stages(plain, expected);
      Pipeline sharded = build(make_mlp(), {.dp = 2, .zero = 3, .reversed_split = true});
      cpprun::load_state_dict(sharded.mine(), dir / file);
      check_stages(sharded, expected);
      cpprun::barrier(group());
    }
  }
  {
    Pipeline saved = build(offset_mlp(), {.tp = 2});
    cpprun::save_state_dict(saved.mine(), dir / "tp/");
  }
  check_unsplit(mlp, dir / "tp/", expected);
  Pipeline split = build(make_mlp(), {.tp = 2, .reversed_split = true});
  cpprun::load_state_dict(split.mine(), dir / "tp/");
  check_stages(split, expected);
}

TEST_CASE("pipeline checkpoint: a {pp, tp} stage of no tensor-parallel module, told its group, saves and loads",
          "[pipeline_checkpoint]") {
  // {pp 2, tp 2}: only h0 and h1 are split, so the second stage (act3 .. out) holds no
  // tensor-parallel module and is whole on both ranks of its tensor-parallel group.
  if (group().size() != 4) return;
  ddp_test::Float64Parity doubles;
  JobDirectory dir;
  const auto expected = named(*offset_mlp());
  for (const std::string file : {"mixed.safetensors", "mixed/"}) {
    INFO(file);
    {
      // Not told: refused before anything is written, the call to make named where it went wrong.
      Pipeline untold = build(offset_mlp(), {.tp = 2, .split_layers = 2});
      try {
        cpprun::save_state_dict(untold.mine(), dir / file);
        FAIL("saved without the stages' tensor-parallel group");
      } catch (const std::exception& e) {
        if (group().rank() % 2 == 1) CHECK_THAT(std::string(e.what()), Catch::Contains("set_tensor_parallel_group"));
      }
    }
    {
      Pipeline saved = build(offset_mlp(), {.tp = 2, .split_layers = 2, .told_tp_group = true});
      cpprun::save_state_dict(saved.mine(), dir / file);
    }
    check_unsplit(mlp, dir / file, expected);
    Pipeline loaded = build(make_mlp(), {.tp = 2, .split_layers = 2, .told_tp_group = true});
    cpprun::load_state_dict(loaded.mine(), dir / file);
    check_stages(loaded, expected);
    // The same checkpoint into all of h0 .. h5 split, and into one pipeline of whole stages.
    Pipeline all_split = build(make_mlp(), {.tp = 2});
    cpprun::load_state_dict(all_split.mine(), dir / file);
    check_stages(all_split, expected);
    cpprun::barrier(group());
  }
}

TEST_CASE("pipeline checkpoint: another model's checkpoint is refused on every rank, nothing loaded",
          "[pipeline_checkpoint]") {
  ddp_test::Float64Parity doubles;
  JobDirectory dir;
  if (group().rank() == 0) {
    auto wider = make_mlp(17);  // every hidden shape differs
    cpprun::save_state_dict(wider, dir / "wider.safetensors");
    auto extra = offset_mlp();
    extra->push_back("extra", torch::nn::Linear(3, 3));
    cpprun::save_state_dict(extra, dir / "extra/");
  }
  cpprun::barrier(group());
  Pipeline pipeline = build(make_mlp(), {});
  const auto before = named(*make_mlp());
  std::string error;
  try {
    cpprun::load_state_dict(pipeline.mine(), dir / "wider.safetensors");
  } catch (const cpprun::StateDictMismatchError& e) {
    error = e.what();
  }
  CHECK_THAT(error, Catch::Contains("shape or dtype differs") && Catch::Contains("h5.weight: file float64 [17, 17]"));
  check_stages(pipeline, before);
  // strict(false): what fits is loaded, the rest reported alike on every rank.
  const auto report =
      cpprun::load_state_dict(pipeline.mine(), dir / "extra/", cpprun::StateDictOptions().strict(false));
  CHECK(report.unexpected_keys == std::vector<std::string>{"extra.bias", "extra.weight"});
  CHECK(report.missing_keys.empty());
  check_stages(pipeline, named(*offset_mlp()));
}

namespace {

constexpr int kRows = 24, kStepsBefore = 2, kSteps = 4;
constexpr int64_t kVocab = 20, kTokens = 5;

struct Task {
  torch::nn::Sequential (*make)();
  std::pair<at::Tensor, at::Tensor> (*batch)(int step);
  at::Tensor (*loss)(const at::Tensor&, const at::Tensor&);
};
torch::nn::Sequential default_mlp() { return make_mlp(); }
std::pair<at::Tensor, at::Tensor> regression_batch(int step) {
  torch::manual_seed(300 + step);
  return {torch::randn({kRows, 6}, torch::kDouble), torch::randn({kRows, 3}, torch::kDouble)};
}
std::pair<at::Tensor, at::Tensor> token_batch(int step) {
  torch::manual_seed(400 + step);
  return {torch::randint(kVocab, {kRows, kTokens}), torch::randint(kVocab, {kRows, kTokens})};
}
at::Tensor mse(const at::Tensor& output, const at::Tensor& target) { return torch::mse_loss(output, target); }
at::Tensor token_loss(const at::Tensor& logits, const at::Tensor& targets) {
  return torch::cross_entropy_loss(logits.flatten(0, 1), targets.flatten());
}
const Task kMlp{default_mlp, regression_batch, mse};
const Task kTiedLm{make_tied_lm, token_batch, token_loss};

// AdamW with two groups, as GPT training has them: matrices decayed, vectors not.
std::unique_ptr<torch::optim::AdamW> adamw(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> decayed, plain;
  for (const auto& p : params) (p.dim() >= 2 ? decayed : plain).push_back(p);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  using torch::optim::AdamWOptions;
  groups.emplace_back(decayed, std::make_unique<AdamWOptions>(AdamWOptions(1e-2).weight_decay(0.1)));
  groups.emplace_back(plain, std::make_unique<AdamWOptions>(AdamWOptions(1e-2).weight_decay(0)));
  return std::make_unique<torch::optim::AdamW>(std::move(groups), torch::optim::AdamWOptions(1e-2));
}

// One process trains the unsplit model on the whole batch, steps [first, last).
void train_unsplit(const Task& task, torch::nn::Sequential& model, torch::optim::AdamW& opt, int first, int last) {
  for (int s = first; s < last; ++s) {
    auto [x, y] = task.batch(s);
    opt.zero_grad();
    task.loss(model->forward(x), y).backward();
    opt.step();
  }
}

const std::map<std::string, at::Tensor>& reference(const Task& task) {
  static std::map<const Task*, std::map<std::string, at::Tensor>> done;
  auto& out = done[&task];
  if (out.empty()) {
    auto model = task.make();
    auto opt = adamw(cpprun::unique_parameters(*model));
    train_unsplit(task, model, *opt, 0, kSteps);
    out = named(*model);
  }
  return out;
}

// The stages' optimizer over this rank's parameters (FSDP: its shards).
std::unique_ptr<torch::optim::AdamW> stages_adamw(Pipeline& pipeline) {
  std::vector<at::Tensor> params;
  for (auto& stage : pipeline.stages) {
    for (const auto& p : stage.parameters()) params.push_back(p);
  }
  return adamw(params);
}

// The pipeline trains steps [first, last) under 1F1B, each pipeline on its share of the batch.
void train_pipeline(const Task& task, Pipeline& pipeline, const Layout& layout, torch::optim::AdamW& opt, int first,
                    int last) {
  cpprun::Schedule1F1B schedule(pipeline.stages[0], /*microbatches=*/2, task.loss);
  const int d = pipeline.mesh ? pipeline.mesh->coordinate("dp") : 0;
  for (int s = first; s < last; ++s) {
    auto [x, y] = task.batch(s);
    opt.zero_grad();
    schedule.step(dist_test::slice(x, d, layout.dp), dist_test::slice(y, d, layout.dp));
    opt.step();
  }
}

}  // namespace

TEST_CASE("pipeline checkpoint: a run stopped by its stages resumes cut another way, or unsplit, as uninterrupted",
          "[pipeline_checkpoint]") {
  ddp_test::Float64Parity doubles;
  constexpr double kTolerance = 1e-10;
  for (const Task* task : {&kMlp, &kTiedLm}) {
    INFO((task == &kMlp ? "MLP" : "tied LM"));
    JobDirectory dir;
    const auto options = cpprun::StateDictSaveOptions().step(kStepsBefore);
    {
      Pipeline first = build(task->make(), {});
      auto opt = stages_adamw(first);
      train_pipeline(*task, first, {}, *opt, 0, kStepsBefore);
      if (task == &kTiedLm) {
        // In the background, while the stages train on: the checkpoint holds the state at the call.
        cpprun::AsyncSave pending = cpprun::save_async(first.mine(), *opt, dir / "ck/", dir / "ck/", options);
        train_pipeline(*task, first, {}, *opt, kStepsBefore, kStepsBefore + 1);
        pending.wait();
      } else {
        cpprun::save_state_dict(first.mine(), *opt, dir / "ck/", options);
      }
    }
    // Unsplit, in one process on each rank.
    {
      auto model = task->make();
      auto opt = adamw(cpprun::unique_parameters(*model));
      cpprun::load_state_dict(model, *opt, dir / "ck/");
      train_unsplit(*task, model, *opt, kStepsBefore, kSteps);
      for (const auto& [name, tensor] : named(*model)) {
        INFO(name);
        const at::Tensor& want = reference(*task).at(name);
        CHECK((tensor - want).abs().max().item<double>() <= kTolerance * want.abs().max().item<double>());
      }
    }
    // Cut another way; with FSDP ZeRO-3 stages over 2 pipelines where the ranks are even.
    {
      Layout layout{.reversed_split = true};
      if (group().size() % 2 == 0 && task == &kMlp) layout = {.dp = 2, .zero = 3, .reversed_split = true};
      Pipeline second = build(task->make(), layout);
      auto opt = stages_adamw(second);
      cpprun::load_state_dict(second.mine(), *opt, dir / "ck/");
      train_pipeline(*task, second, layout, *opt, kStepsBefore, kSteps);
      check_stages(second, reference(*task), kTolerance);
    }
    cpprun::barrier(group());
    // The reverse: the unsplit run's checkpoint (one process writes it) resumes in stages.
    if (group().rank() == 0) {
      auto model = task->make();
      auto opt = adamw(cpprun::unique_parameters(*model));
      train_unsplit(*task, model, *opt, 0, kStepsBefore);
      cpprun::save_state_dict(model, *opt, dir / "unsplit/", options);
    }
    cpprun::barrier(group());
    Pipeline third = build(task->make(), {});
    auto opt = stages_adamw(third);
    cpprun::load_state_dict(third.mine(), *opt, dir / "unsplit/");
    train_pipeline(*task, third, {}, *opt, kStepsBefore, kSteps);
    check_stages(third, reference(*task), kTolerance);
  }
}

// The stages' pair save is one save (Note [A failed save puts the previous files back]): an
// optimizer's part that fails puts back the model's files it had replaced (they stayed new beside
// the earlier optimizer's before), and a trainer's files given to it are part of it too. The pair
// load refuses a model and an optimizer of two saves before loading either.
TEST_CASE("pipeline checkpoint: the stages' pair save is one save, its trainer files included; the pair load checks",
          "[pipeline_checkpoint]") {
  ddp_test::Float64Parity doubles;  // the tasks' batches are float64
  JobDirectory dir;
  const int rank = group().rank();
  Pipeline pipeline = build(kMlp.make(), {});
  auto opt = stages_adamw(pipeline);
  train_pipeline(kMlp, pipeline, {}, *opt, 0, 1);
  const std::string ck = dir / "ck/";
  const auto contents = [&] { return dist_test::directory_contents(ck); };
  const auto save = [&](int step) {
    const std::map<std::string, std::string> files{{"trainer.json", "{\"step\": " + std::to_string(step) + "}"}};
    cpprun::save_state_dict(pipeline.mine(), *opt, ck, cpprun::StateDictSaveOptions().step(step),
                            rank == 0 ? files : std::map<std::string, std::string>{});
  };
  save(1);
  const auto saved = rank == 0 ? contents() : std::map<std::string, std::string>();
  if (rank == 0) CHECK(saved.at("trainer.json") == "{\"step\": 1}");
  train_pipeline(kMlp, pipeline, {}, *opt, 1, 2);
  for (const std::string last : {"optimizer.safetensors.index.json", "trainer.json"}) {
    INFO("blocked: " << last);
    dist_test::check_blocked_save_changes_nothing(ck, last, [&] { save(2); }, saved);
  }
  save(2);
  if (rank == 0) CHECK(contents().at("trainer.json") == "{\"step\": 2}");
  // Stages over two pipelines: each stage's owner hears the failure from owner 0, then its team
  // from it; the error names the rank that raised it once.
  if (group().size() % 2 == 0) {
    const Layout two_pipelines{.dp = 2, .zero = 1};
    Pipeline replicated = build(kMlp.make(), two_pipelines);
    auto replicated_opt = stages_adamw(replicated);
    train_pipeline(kMlp, replicated, two_pipelines, *replicated_opt, 0, 1);
    const std::string other = dir / "two_pipelines/";
    const auto save_replicated = [&] {
      const std::map<std::string, std::string> files{{"trainer.json", "{}"}};
      cpprun::save_state_dict(replicated.mine(), *replicated_opt, other, cpprun::StateDictSaveOptions(),
                              rank == 0 ? files : std::map<std::string, std::string>{});
    };
    save_replicated();
    const auto before = rank == 0 ? dist_test::directory_contents(other) : std::map<std::string, std::string>();
    dist_test::check_blocked_save_changes_nothing(other, "trainer.json", save_replicated, before);
  }
  // The optimizer saved again alone (a new save id): the pair load refuses the mix before loading
  // the model (it loaded the model, then refused the optimizer).
  cpprun::save_optimizer_state_dict(pipeline.mine(), *opt, ck, cpprun::StateDictSaveOptions().step(3));
  Pipeline fresh = build(kMlp.make(), {});
  auto fresh_opt = stages_adamw(fresh);
  const auto before = named(*fresh.model);
  CHECK_THROWS_WITH(cpprun::load_state_dict(fresh.mine(), *fresh_opt, ck),
                    Catch::Contains("from another save") && Catch::Contains("nothing was loaded"));
  for (const auto& [name, tensor] : named(*fresh.model)) CHECK(torch::equal(tensor, before.at(name)));
}

// FSDP stages' save_async to a directory gathers each tensor to its writer in the stage, on the
// calling thread (checkpoint/writer_gather.h): its files are the synchronous save's, byte for byte,
// though the stages train on while they are written.
TEST_CASE("pipeline checkpoint: {pp, dp} FSDP stages' save_async to a directory writes the synchronous save's files",
          "[pipeline_checkpoint]") {
  if (group().size() % 2 != 0) return;  // np1, np3: no even layout
  ddp_test::Float64Parity doubles;
  JobDirectory dir;
  const auto options = cpprun::StateDictSaveOptions().step(kStepsBefore).save_id("0f1e2d3c4b5a69780f1e2d3c4b5a6978");
  const auto bytes_of = [](const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  };
  for (const int zero : {1, 3}) {
    INFO("ZeRO-" << zero);
    const Layout layout{.dp = 2, .zero = zero};
    const std::string sync_dir = dir / ("sync_" + std::to_string(zero) + "/"),
                      async_dir = dir / ("async_" + std::to_string(zero) + "/");
    Pipeline saved = build(make_mlp(), layout);
    auto opt = stages_adamw(saved);
    train_pipeline(kMlp, saved, layout, *opt, 0, kStepsBefore);
    cpprun::save_state_dict(saved.mine(), *opt, sync_dir, options);
    cpprun::AsyncSave pending = cpprun::save_async(saved.mine(), *opt, async_dir, async_dir, options);
    train_pipeline(kMlp, saved, layout, *opt, kStepsBefore, kStepsBefore + 1);
    pending.wait();
    cpprun::barrier(group());
    std::set<std::string> in_sync, in_async;
    for (const auto& e : fs::directory_iterator(sync_dir)) in_sync.insert(e.path().filename().string());
    for (const auto& e : fs::directory_iterator(async_dir)) in_async.insert(e.path().filename().string());
    CHECK(in_sync == in_async);
    CHECK(in_sync.size() >= 4);  // a model's and an optimizer's file and index
    for (const auto& name : in_sync) {
      INFO(name);
      CHECK(bytes_of(fs::path(sync_dir) / name) == bytes_of(fs::path(async_dir) / name));
    }
    cpprun::barrier(group());
  }
}

TEST_CASE("pipeline checkpoint: stages whose optimizers' groups differ, or another model's optimizer, are refused",
          "[pipeline_checkpoint]") {
  ddp_test::Float64Parity doubles;
  JobDirectory dir;
  Pipeline pipeline = build(make_mlp(), {});
  std::vector<at::Tensor> params;
  for (auto& stage : pipeline.stages) {
    for (const auto& p : stage.parameters()) params.push_back(p);
  }
  // Another learning rate on the last stage: not one optimizer's state.
  const bool last = pipeline.stages[0].is_last();
  torch::optim::AdamW odd(params, torch::optim::AdamWOptions(last && group().size() > 1 ? 2e-2 : 1e-2));
  std::string error;
  try {
    cpprun::save_optimizer_state_dict(pipeline.mine(), odd, dir / "odd/");
  } catch (const c10::Error& e) {
    error = e.what_without_backtrace();
  }
  if (group().size() > 1) {
    CHECK_THAT(error, Catch::Contains("the pipeline stages' optimizers differ: param group 0"));
  } else {
    CHECK(error.empty());
  }
  // The tied LM's optimizer state does not fit the MLP's stages: refused on every rank.
  if (group().rank() == 0) {
    auto lm = make_tied_lm();
    auto opt = adamw(cpprun::unique_parameters(*lm));
    train_unsplit(kTiedLm, lm, *opt, 0, 1);
    cpprun::save_state_dict(lm, *opt, dir / "lm/");
  }
  cpprun::barrier(group());
  auto opt = adamw(params);
  std::string refused;
  try {
    cpprun::load_optimizer_state_dict(pipeline.mine(), *opt, dir / "lm/");
  } catch (const cpprun::StateDictMismatchError& e) {
    refused = e.what();
  }
  CHECK_THAT(refused, Catch::Contains("parameters missing from the file") &&
                          Catch::Contains("parameters in the file but not in the model"));
}

namespace {

// A model named as GPT-2 is (transformer.wte, transformer.h.<i>, lm_head tied to the token
// embedding), and the Sequential a pipeline cuts, assembled from its modules as train_gpt does:
// "embed", "h<i>" holding the block as "block", "head". The stages save and load under the
// model's names through set_state_dict_prefixes.
struct TrunkImpl : torch::nn::Module {
  torch::nn::Embedding wte{register_module("wte", torch::nn::Embedding(kVocab, 8))};
  torch::nn::ModuleList h{register_module("h", torch::nn::ModuleList())};
  TrunkImpl() {
    for (int i = 0; i < 4; ++i) h->push_back(torch::nn::Linear(8, 8));
  }
};
TORCH_MODULE(Trunk);

struct NestedLmImpl : torch::nn::Module {
  NestedLmImpl() {
    torch::manual_seed(23);
    transformer = register_module("transformer", Trunk());
    lm_head = register_module("lm_head", TiedHead(transformer->wte->weight));
  }
  Trunk transformer{nullptr};
  TiedHead lm_head{nullptr};
};
TORCH_MODULE(NestedLm);

struct BlockSlotImpl : torch::nn::Module {
  explicit BlockSlotImpl(const torch::nn::Linear& b) : block(register_module("block", b)) {}
  at::Tensor forward(const at::Tensor& x) { return block(x); }
  torch::nn::Linear block;
};
TORCH_MODULE(BlockSlot);

torch::nn::Sequential as_pipe(const NestedLm& lm) {
  torch::nn::Sequential pipe;
  pipe->push_back("embed", lm->transformer->wte);
  for (std::size_t i = 0; i < lm->transformer->h->size(); ++i) {
    pipe->push_back("h" + std::to_string(i),
                    BlockSlot(torch::nn::Linear(lm->transformer->h->ptr<torch::nn::LinearImpl>(i))));
  }
  pipe->push_back("head", lm->lm_head);
  return pipe;
}

std::vector<std::pair<std::string, std::string>> nested_prefixes() {
  std::vector<std::pair<std::string, std::string>> prefixes{{"embed", "transformer.wte"}, {"head", "lm_head"}};
  for (int i = 0; i < 4; ++i) {
    prefixes.emplace_back("h" + std::to_string(i) + ".block", "transformer.h." + std::to_string(i));
  }
  return prefixes;
}

torch::nn::Sequential make_nested_pipe() { return as_pipe(NestedLm()); }
const Task kNestedLm{make_nested_pipe, token_batch, token_loss};

Pipeline build_nested(const Layout& layout) {
  Pipeline out = build(make_nested_pipe(), layout);
  for (auto& stage : out.stages) stage.set_state_dict_prefixes(nested_prefixes());
  return out;
}

}  // namespace

TEST_CASE("pipeline checkpoint: stages assembled from a model's modules save and resume under its names",
          "[pipeline_checkpoint]") {
  ddp_test::Float64Parity doubles;
  constexpr double kTolerance = 1e-10;
  JobDirectory dir;
  const auto options = cpprun::StateDictSaveOptions().step(kStepsBefore);
  {
    Pipeline first = build_nested({});
    auto opt = stages_adamw(first);
    train_pipeline(kNestedLm, first, {}, *opt, 0, kStepsBefore);
    cpprun::save_state_dict(first.mine(), *opt, dir / "ck/", options);
  }
  // The model itself loads it, strictly: every name is its own (one process on each rank).
  {
    NestedLm lm;
    auto opt = adamw(cpprun::unique_parameters(*lm));
    const auto report = cpprun::load_state_dict(lm, *opt, dir / "ck/");
    CHECK(report.missing_keys.empty());
    auto pipe = as_pipe(lm);
    train_unsplit(kNestedLm, pipe, *opt, kStepsBefore, kSteps);
    for (const auto& [name, tensor] : named(*pipe)) {
      INFO(name);
      const at::Tensor& want = reference(kNestedLm).at(name);
      CHECK((tensor - want).abs().max().item<double>() <= kTolerance * want.abs().max().item<double>());
    }
  }
  cpprun::barrier(group());
  // The reverse: the model's own checkpoint (one process writes it) resumes in stages cut another way.
  if (group().rank() == 0) {
    NestedLm lm;
    auto opt = adamw(cpprun::unique_parameters(*lm));
    auto pipe = as_pipe(lm);
    train_unsplit(kNestedLm, pipe, *opt, 0, kStepsBefore);
    cpprun::save_state_dict(lm, *opt, dir / "unsplit/", options);
  }
  cpprun::barrier(group());
  {
    Pipeline second = build_nested({.reversed_split = true});
    auto opt = stages_adamw(second);
    cpprun::load_state_dict(second.mine(), *opt, dir / "unsplit/");
    train_pipeline(kNestedLm, second, {}, *opt, kStepsBefore, kSteps);
    check_stages(second, reference(kNestedLm), kTolerance);
  }
  // Without the prefixes the stages' names are the Sequential's, which the model's file lacks.
  {
    Pipeline unnamed = build(make_nested_pipe(), {});
    CHECK_THROWS_AS(cpprun::load_state_dict(unnamed.mine(), dir / "unsplit/"), cpprun::StateDictMismatchError);
  }
  // Two tensors given one name: refused on every rank (by the rank holding both, or by the
  // file's writer), nothing written.
  Pipeline clash = build(make_nested_pipe(), {});
  for (auto& stage : clash.stages) stage.set_state_dict_prefixes({{"h0.block", "x"}, {"h1.block", "x"}});
  std::string error;
  try {
    cpprun::save_state_dict(clash.mine(), dir / "clash.safetensors");
  } catch (const c10::Error& e) {
    error = e.what_without_backtrace();
  }
  CHECK(!error.empty());
  if (group().rank() == 0) {
    CHECK_THAT(error, Catch::Contains("\"x.weight\""));
    CHECK(!fs::exists(dir / "clash.safetensors"));
  }
  // The same in the background: refused on every rank before anything is written.
  error.clear();
  try {
    cpprun::AsyncSave pending = cpprun::save_async(clash.mine(), dir / "clash_async/");
    pending.wait();
  } catch (const c10::Error& e) {
    error = e.what_without_backtrace();
  }
  CHECK(!error.empty());
  cpprun::barrier(group());
  if (group().rank() == 0) CHECK(!fs::exists(dir / "clash_async/model.safetensors.index.json"));
}

TEST_CASE("pipeline checkpoint: a mistake one rank makes in a stages' call is refused on every rank: some of its "
          "stages, another model's optimizer, another path or format, other prefixes", "[pipeline_checkpoint]") {
  // Each was refused on the rank that made it alone (the others waited out the group's timeout), or
  // not at all: ranks given two paths each read their own (a model made of two saves), and
  // prefixes on some ranks only wrote an index of prefixed and plain names.
  const int p = group().size();
  if (p == 1) return;  // nothing to differ from
  ddp_test::Float64Parity doubles;
  JobDirectory dir;
  const bool last = group().rank() == p - 1;
  const std::string elsewhere = "(raised on rank " + std::to_string(p - 1) + ", so every rank refuses cpprun::";
  {
    // The last rank passes one of its two stages.
    Pipeline two = build(offset_mlp(), {.v = 2});
    std::vector<cpprun::PipelineStage*> given = two.mine();
    if (last) given.pop_back();
    const std::string partial = "this rank holds 2 of the split's " + std::to_string(2 * p) + " stages, but 1 were "
                                "given";
    CHECK_THAT(error_of([&] { cpprun::save_state_dict(given, dir / "partial.safetensors"); }),
               Catch::Contains(partial) && Catch::Contains(last ? "" : elsewhere + "save_state_dict)"));
    CHECK_THAT(error_of([&] { cpprun::load_state_dict(given, dir / "partial.safetensors"); }),
               Catch::Contains(partial));
    CHECK_THAT(error_of([&] { cpprun::save_async(given, dir / "partial/").wait(); }), Catch::Contains(partial));
  }
  Pipeline pipeline = build(offset_mlp(), {});
  {
    // The last rank's optimizer holds another model's parameters.
    auto other = make_mlp();
    auto opt = adamw(last ? cpprun::unique_parameters(*other) : pipeline.stages[0].parameters());
    const std::string refused = error_of([&] { cpprun::save_optimizer_state_dict(pipeline.mine(), *opt, dir / "o/"); });
    CHECK(!refused.empty());
    if (!last) CHECK_THAT(refused, Catch::Contains(elsewhere + "save_optimizer_state_dict)"));
    CHECK(!error_of([&] { cpprun::save_state_dict(pipeline.mine(), *opt, dir / "pair/"); }).empty());
    // Loads too, before their first collective (the others waited in it), the pair's before the
    // model is loaded (a review, 2026-12-07).
    auto good = stages_adamw(pipeline);
    cpprun::save_state_dict(pipeline.mine(), *good, dir / "good/");
    const std::string load_refused =
        error_of([&] { cpprun::load_optimizer_state_dict(pipeline.mine(), *opt, dir / "good/"); });
    CHECK_THAT(load_refused, Catch::Contains("not a parameter of the model"));
    if (!last) CHECK_THAT(load_refused, Catch::Contains(elsewhere + "load_optimizer_state_dict)"));
    const std::string pair_refused = error_of([&] { cpprun::load_state_dict(pipeline.mine(), *opt, dir / "good/"); });
    CHECK_THAT(pair_refused, Catch::Contains("not a parameter of the model"));
    if (!last) CHECK_THAT(pair_refused, Catch::Contains(elsewhere + "load_state_dict)"));
  }
  // Another path on the last rank: saves refused, loads too (a model of two saves), naming both.
  cpprun::save_state_dict(pipeline.mine(), dir / "a.safetensors");
  cpprun::save_state_dict(pipeline.mine(), dir / "b.safetensors");
  cpprun::save_state_dict(pipeline.mine(), dir / "a/");
  const std::string rank_of_last = ", rank " + std::to_string(p - 1) + " ";
  for (const auto& [mine, theirs] : std::vector<std::pair<std::string, std::string>>{
           {"a.safetensors", "b.safetensors"}, {"a.safetensors", "a/"}}) {
    INFO(mine << " and " << theirs);
    const std::string path = dir / (last ? theirs : mine);
    const std::string differ = "the pipeline's ranks were given different checkpoints: pipeline rank 0 \"" +
                               (dir / mine) + "\"" + (mine.back() == '/' ? "" : " (a file)");
    CHECK_THAT(error_of([&] { cpprun::save_state_dict(pipeline.mine(), path); }),
               Catch::Contains(differ) && Catch::Contains(rank_of_last));
    CHECK_THAT(error_of([&] { (void)cpprun::load_state_dict(pipeline.mine(), path); }), Catch::Contains(differ));
    CHECK_THAT(error_of([&] { cpprun::save_async(pipeline.mine(), path).wait(); }), Catch::Contains(differ));
  }
  // Prefixes on the last rank's stages alone: refused, naming both lists.
  if (last) pipeline.stages[0].set_state_dict_prefixes({{"in", "model.in"}});
  CHECK_THAT(error_of([&] { cpprun::save_state_dict(pipeline.mine(), dir / "prefixed/"); }),
             Catch::Contains("different set_state_dict_prefixes: pipeline rank 0 none" + rank_of_last +
                             "{{\"in\", \"model.in\"}}"));
  // Agreed again, the ranks save and load together.
  pipeline.stages[0].set_state_dict_prefixes({});
  Pipeline loaded = build(make_mlp(), {});
  cpprun::load_state_dict(loaded.mine(), dir / "a.safetensors");
  check_stages(loaded, named(*offset_mlp()));
}

// The agreement was over the pipeline group alone: with two pipelines ({pp 2, dp 2}, or {pp 2,
// tp 2}'s one a tensor-parallel rank), a mistake one pipeline made left the other's ranks waiting
// in the save's data- or tensor-parallel collectives until the timeout, and two pipelines given
// two paths each wrote their own, without an error (Note [Agreement across pipelines]).
TEST_CASE("pipeline checkpoint: a mistake one pipeline of a {pp, dp} or {pp, tp} job makes is refused on every rank",
          "[pipeline_checkpoint]") {
  if (group().size() != 4) return;  // two pipelines of two stages
  ddp_test::Float64Parity doubles;
  JobDirectory dir;
  const int rank = group().rank();
  const bool last = rank == 3;  // the pipeline {1, 3} in both layouts; {0, 2} the other
  for (const bool data_parallel : {true, false}) {
    const Layout layout = data_parallel ? Layout{.dp = 2, .zero = 3} : Layout{.tp = 2};
    const std::string kind = data_parallel ? "data-parallel" : "tensor-parallel";
    INFO(kind);
    Pipeline pipeline = build(offset_mlp(), layout);
    // Each pipeline its own path: agreed within each, refused across them.
    const std::string mine = kind + (rank % 2 == 1 ? "_b.safetensors" : "_a.safetensors");
    const std::string across = "the " + kind + " group's ranks were given different checkpoints";
    CHECK_THAT(error_of([&] { cpprun::save_state_dict(pipeline.mine(), dir / mine); }), Catch::Contains(across));
    CHECK_THAT(error_of([&] { cpprun::save_async(pipeline.mine(), dir / mine).wait(); }), Catch::Contains(across));
    CHECK_FALSE(fs::exists(dir / (kind + "_a.safetensors")));
    CHECK_FALSE(fs::exists(dir / (kind + "_b.safetensors")));
    // One rank its own path: refused in its pipeline, then the refusal carried to the other.
    const std::string one = kind + (last ? "_b/" : "_a/");
    CHECK_THAT(error_of([&] { cpprun::save_state_dict(pipeline.mine(), dir / one); }),
               Catch::Contains("were given different checkpoints"));
    // One rank's optimizer over another model's parameters: every rank refuses, in a save and a load,
    // naming the rank that raised it once however many groups relayed it.
    const auto raised_once = [](const std::string& error) {
      const auto at = error.find("(raised on rank ");
      return at == std::string::npos || error.find("(raised on rank ", at + 1) == std::string::npos;
    };
    auto other = make_mlp();
    auto good = stages_adamw(pipeline);
    auto opt = last ? adamw(cpprun::unique_parameters(*other)) : stages_adamw(pipeline);
    std::vector<std::string> refusals;
    refusals.push_back(
        error_of([&] { cpprun::save_optimizer_state_dict(pipeline.mine(), *opt, dir / (kind + "_o/")); }));
    cpprun::save_state_dict(pipeline.mine(), *good, dir / (kind + "_pair/"));
    refusals.push_back(
        error_of([&] { cpprun::load_optimizer_state_dict(pipeline.mine(), *opt, dir / (kind + "_pair/")); }));
    refusals.push_back(
        error_of([&] { (void)cpprun::load_state_dict(pipeline.mine(), *opt, dir / (kind + "_pair/")); }));
    for (const std::string& refusal : refusals) {
      CHECK_THAT(refusal, Catch::Contains("not a parameter of the model"));
      CHECK(raised_once(refusal));
    }
    // Agreed, the job saves and loads together.
    Pipeline loaded = build(make_mlp(), layout);
    auto loaded_opt = stages_adamw(loaded);
    cpprun::load_state_dict(loaded.mine(), *loaded_opt, dir / (kind + "_pair/"));
    check_stages(loaded, named(*offset_mlp()));
  }
}

TEST_CASE("pipeline checkpoint: save_async writes the stages' checkpoint in the background, as it was at the call",
          "[pipeline_checkpoint]") {
  ddp_test::Float64Parity doubles;
  JobDirectory dir;
  const auto expected = named(*offset_mlp());
  std::vector<std::pair<std::string, Layout>> cases = {
      {"async.safetensors", {}}, {"async.pt", {}}, {"async/", {}}, {"async_v2/", {.v = 2}}};
  if (group().size() % 2 == 0) {
    cases.push_back({"async_fsdp.safetensors", {.dp = 2, .zero = 3}});
    cases.push_back({"async_fsdp/", {.dp = 2, .zero = 3}});
    cases.push_back({"async_tp/", {.tp = 2}});
  }
  for (const auto& [file, layout] : cases) {
    INFO(file << " dp " << layout.dp << " tp " << layout.tp << " v " << layout.v);
    {
      Pipeline saved = build(offset_mlp(), layout);
      cpprun::AsyncSave pending = cpprun::save_async(saved.mine(), dir / file, cpprun::StateDictSaveOptions().step(5));
      // Training goes on: every parameter changes before the files are (likely) written.
      torch::NoGradGuard no_grad;
      for (auto& stage : saved.stages) {
        for (auto& p : stage.parameters()) p.add_(1.0);
      }
      pending.wait();
      CHECK(pending.done());
    }
    check_unsplit(mlp, dir / file, expected);
    Pipeline loaded = build(make_mlp(), {.reversed_split = true});
    cpprun::load_state_dict(loaded.mine(), dir / file);
    check_stages(loaded, expected);
    cpprun::barrier(group());  // read everywhere before the next save
  }
  // Model and optimizer as two files, one save id: both load together unsplit.
  {
    Pipeline saved = build(offset_mlp(), {});
    auto opt = stages_adamw(saved);
    train_pipeline(kMlp, saved, {}, *opt, 0, 1);
    const auto trained = [&] {
      std::map<std::string, at::Tensor> out;
      for (auto& stage : saved.stages) {
        for (const auto& item : stage.module()->named_parameters()) out[item.key()] = item.value().detach().clone();
      }
      return out;
    }();
    cpprun::AsyncSave pending = cpprun::save_async(saved.mine(), *opt, dir / "m.safetensors", dir / "o.safetensors");
    pending.wait();
    cpprun::barrier(group());
    auto plain = make_mlp();
    auto plain_opt = adamw(cpprun::unique_parameters(*plain));
    cpprun::load_state_dict(plain, dir / "m.safetensors");
    cpprun::load_optimizer_state_dict(plain, *plain_opt, dir / "o.safetensors");
    for (const auto& [name, tensor] : trained) {
      INFO(name);
      CHECK(at::equal(plain->named_parameters()[name], tensor));
    }
    CHECK(plain_opt->state().size() == cpprun::unique_parameters(*plain).size());
  }
  // A save that fails (a file where a directory should be) fails on every rank, at wait(), and
  // leaves no index; the error is raised once, so the next save runs.
  if (group().rank() == 0) std::ofstream(dir / "blocker") << "not a directory";
  cpprun::barrier(group());
  Pipeline saved = build(offset_mlp(), {});
  cpprun::AsyncSave failed = cpprun::save_async(saved.mine(), dir / "blocker/sub/");
  CHECK_THROWS_WITH(failed.wait(), Catch::Contains("blocker"));
  CHECK_FALSE(fs::exists(dir / "blocker/sub/model.safetensors.index.json"));
  cpprun::save_state_dict(saved.mine(), dir / "after/");
  check_unsplit(mlp, dir / "after/", expected);
}
