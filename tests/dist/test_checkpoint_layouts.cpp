// Checkpoints through the distributed state view (checkpoint/state_view.h), under
// `cpprun --nproc_per_node=K`: a model and its AdamW state saved at one parallel layout load at
// any other, and training goes on to the parameters of the run that was never interrupted. The
// model is a stack of Megatron-split MLP blocks on a {dp, tp} mesh (tp 2 at an even K, else 1),
// float64 throughout, so that layouts differ by summation order alone (Note [Parity in float64]
// in parity_checks.h). Saved at {dp, tp} ZeRO-3 (sharded directory, background save, single
// files) and resumed under {dp, tp} ZeRO-1 and DDP, under DDP over every rank without tensor
// parallelism, and in one process on each rank. Under mixed precision (param_dtype float32 over
// float64 masters) the masters are what is saved: a save of the compute copies would lose their
// low bits, and the resumed run would leave the tolerance at once.
// The earlier formats go through the same view: save_sharded_checkpoint's rank_<q>.pt files saved
// at {dp, tp} ZeRO-3, DDP and under mixed precision resume elsewhere the same way, and
// save_full_state_dict's TorchScript archive is, at every layout, torch::save of the unsplit
// model (the masters under mixed precision), while torch::save's own archives load into each.
#include "catch.h"
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <utility>

#include "cpprun/cpprun.h"
#include "ddp_test_models.h"
#include "dist_test_support.h"

using dist_test::group;
using ddp_test::relative_difference;

namespace {

namespace fs = std::filesystem;

// float64 on both sides: the layouts differ by summation order, about 1e-15 per step; a wrong row,
// a lost optimizer state or a low-precision copy differs by far more (AdamW moves a parameter by
// about the learning rate per step).
constexpr double kTolerance = 1e-10;
constexpr int64_t kHidden = 8, kSequence = 4, kGlobalBatch = 12;  // 12 rows: every dp size of 1..4 divides them
constexpr int kBlocks = 2, kStepsBefore = 3, kStepsAfter = 3;

struct StackImpl : torch::nn::Module {
  StackImpl() {
    torch::manual_seed(7);
    for (int b = 0; b < kBlocks; ++b) {
      h->push_back(torch::nn::Sequential(torch::nn::LayerNorm(torch::nn::LayerNormOptions({kHidden})),
                                         torch::nn::Linear(kHidden, 4 * kHidden), torch::nn::GELU(),
                                         torch::nn::Linear(4 * kHidden, kHidden)));
    }
    register_module("h", h);
    to(torch::kDouble);
  }
  at::Tensor forward(at::Tensor x) {
    for (const auto& block : *h) x = x + block->as<torch::nn::SequentialImpl>()->forward(x);
    return x;
  }
  torch::nn::ModuleList h;
};
TORCH_MODULE(Stack);

// A parallel layout: the tensor-parallel size, and the wrapper over the data-parallel dimension
// ("ddp", "zero1".."zero3"; "none": a plain unsplit module in this process alone).
struct Layout {
  int tp = 1;
  std::string how;
  bool mixed_precision = false;  // FSDP computing in float32 over float64 masters
  std::string str() const {
    return how + " at tp " + std::to_string(tp) + (mixed_precision ? ", param_dtype float32" : "");
  }
};

const cpprun::DeviceMesh& mesh(int tp) {
  static std::map<int, cpprun::DeviceMesh> meshes;  // made once per size, in the same order on every rank
  auto found = meshes.find(tp);
  if (found == meshes.end()) {
    found = meshes.emplace(tp, cpprun::DeviceMesh(group(), {group().size() / tp, tp}, {"dp", "tp"})).first;
  }
  return found->second;
}

int default_tp() { return group().size() % 2 == 0 ? 2 : 1; }

// A model at `layout`, built from the same initial values everywhere, and its optimizer.
struct Trainer {
  explicit Trainer(Layout at) : layout(std::move(at)) {
    if (layout.how == "none") {
      optimizer = std::make_unique<torch::optim::AdamW>(net->parameters(), torch::optim::AdamWOptions(1e-2));
      return;
    }
    const auto& m = mesh(layout.tp);
    if (layout.tp > 1) {
      cpprun::ParallelizePlan plan;
      for (int b = 0; b < kBlocks; ++b) {
        plan.push_back({"h." + std::to_string(b) + ".1", cpprun::ColwiseParallel()});
        plan.push_back({"h." + std::to_string(b) + ".3", cpprun::RowwiseParallel()});
      }
      cpprun::parallelize_module(net.ptr(), m, "tp", plan);
    }
    if (layout.how == "ddp") {
      model = cpprun::DistributedDataParallel(net, m.group("dp"));
    } else {
      auto options = cpprun::FsdpOptions().stage(layout.how.back() - '0');
      if (layout.mixed_precision) options.param_dtype(torch::kFloat);
      model = cpprun::FullyShardedDataParallel(net, m.group("dp"), options);
    }
    optimizer = std::make_unique<torch::optim::AdamW>(model->parameters(), torch::optim::AdamWOptions(1e-2));
  }

  // Steps [first, last) on the global batches: each replica its rows (a plain module all of them).
  void train(int first, int last) {
    for (int step = first; step < last; ++step) {
      torch::manual_seed(1000 + step);
      const auto f64 = at::TensorOptions().dtype(at::kDouble);
      at::Tensor x = torch::randn({kGlobalBatch, kSequence, kHidden}, f64);
      at::Tensor target = torch::randn({kGlobalBatch, kSequence, kHidden}, f64);
      optimizer->zero_grad();
      if (layout.how == "none") {
        torch::mse_loss(net->forward(x), target).backward();
      } else {
        const auto& m = mesh(layout.tp);
        const int replica = m.coordinate("dp"), replicas = m.size("dp");
        at::Tensor out = model->forward(dist_test::slice(x, replica, replicas));
        torch::mse_loss(out.to(torch::kDouble), dist_test::slice(target, replica, replicas)).backward();
      }
      optimizer->step();
    }
  }

  template <typename F>
  decltype(auto) on_model(F&& f) {
    return layout.how == "none" ? f(net) : f(model);
  }

  Layout layout;
  Stack net;
  cpprun::DataParallel<StackImpl> model{nullptr};
  std::unique_ptr<torch::optim::AdamW> optimizer;
};

// One directory for the job (MASTER_PORT is the job's own), removed at the end.
struct JobDirectory {
  JobDirectory() : path(fs::temp_directory_path() / ("cpprun_layouts_" + std::string(std::getenv("MASTER_PORT")))) {
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

// The trainer's whole parameters under the unsplit names (the float64 masters under mixed
// precision), by saving them and loading the file into a plain float64 stack (strict: a float32
// tensor in the file is refused).
std::map<std::string, at::Tensor> whole_parameters(Trainer& trainer, const std::string& file) {
  trainer.on_model([&](auto& m) {
    if (trainer.layout.how == "none") {
      if (group().rank() == 0) cpprun::save_state_dict(m, file);
    } else {
      cpprun::save_state_dict(m, file);
    }
  });
  cpprun::barrier(group());
  Stack plain;
  cpprun::load_state_dict(plain, file);
  std::map<std::string, at::Tensor> out;
  for (const auto& item : plain->named_parameters()) out[item.key()] = item.value().detach().clone();
  cpprun::barrier(group());  // every rank has read the file before it is written again
  return out;
}

void check_same(const std::map<std::string, at::Tensor>& resumed, const std::map<std::string, at::Tensor>& reference,
                const std::string& what) {
  double worst = 0;
  REQUIRE(resumed.size() == reference.size());
  for (const auto& [name, tensor] : reference) {
    INFO(what << ": " << name);
    REQUIRE(resumed.count(name) == 1);
    worst = std::max(worst, relative_difference(resumed.at(name), tensor));
  }
  if (group().rank() == 0) std::printf("%s: worst relative difference %.3g\n", what.c_str(), worst);
  INFO(what << ": worst relative difference " << worst);
  CHECK(worst <= kTolerance);
}

// How a checkpoint is written: a sharded directory (both saves into one, same options, no id
// given by hand), the same in the background, two single files, or the earlier format of
// save_sharded_checkpoint (rank_<q>.pt and meta.pt).
enum class SaveKind { kDirectory, kAsync, kFiles, kEarlierSharded };

void save(Trainer& trainer, SaveKind kind, const JobDirectory& dir) {
  const auto options = cpprun::StateDictSaveOptions().step(kStepsBefore).save_id(cpprun::new_save_id());
  trainer.on_model([&](auto& m) {
    switch (kind) {
      case SaveKind::kDirectory:
        cpprun::save_state_dict(m, dir / "ck/", options);
        cpprun::save_optimizer_state_dict(m, *trainer.optimizer, dir / "ck/", options);
        break;
      case SaveKind::kAsync: {
        auto pending = cpprun::save_async(m, *trainer.optimizer, dir / "async/", dir / "async/", options);
        pending.wait();
        break;
      }
      case SaveKind::kFiles:
        cpprun::save_state_dict(m, dir / "model.safetensors", options);
        cpprun::save_optimizer_state_dict(m, *trainer.optimizer, dir / "optimizer.safetensors", options);
        break;
      case SaveKind::kEarlierSharded:
        cpprun::save_sharded_checkpoint(m, *trainer.optimizer, dir / "earlier");
        break;
    }
  });
}

void load(Trainer& trainer, SaveKind kind, const JobDirectory& dir) {
  const std::string model_path = kind == SaveKind::kDirectory ? dir / "ck/"
                                 : kind == SaveKind::kAsync   ? dir / "async/"
                                                              : dir / "model.safetensors";
  const std::string optimizer_path = kind == SaveKind::kFiles ? dir / "optimizer.safetensors" : model_path;
  trainer.on_model([&](auto& m) {
    if (kind == SaveKind::kEarlierSharded) {
      cpprun::load_sharded_checkpoint(m, *trainer.optimizer, dir / "earlier");
      return;
    }
    cpprun::load_state_dict(m, model_path);
    cpprun::load_optimizer_state_dict(m, *trainer.optimizer, optimizer_path);
  });
}

}  // namespace

TEST_CASE("checkpoint layouts: a save at {dp, tp} ZeRO-3 resumes under every other layout", "[layouts]") {
  JobDirectory dir;
  const int tp = default_tp();
  Trainer saved({tp, "zero3"});
  saved.train(0, kStepsBefore);
  for (SaveKind kind : {SaveKind::kDirectory, SaveKind::kAsync, SaveKind::kFiles}) save(saved, kind, dir);
  saved.train(kStepsBefore, kStepsBefore + kStepsAfter);  // the run that was never interrupted
  const auto reference = whole_parameters(saved, dir / "reference.safetensors");

  const std::vector<std::pair<Layout, SaveKind>> resumes{
      {{tp, "zero1"}, SaveKind::kDirectory}, {{tp, "ddp"}, SaveKind::kAsync}, {{tp, "zero3"}, SaveKind::kFiles},
      {{1, "ddp"}, SaveKind::kDirectory},    {{1, "zero2"}, SaveKind::kAsync}, {{1, "none"}, SaveKind::kFiles}};
  for (const auto& [layout, kind] : resumes) {
    Trainer resumed(layout);
    load(resumed, kind, dir);
    resumed.train(kStepsBefore, kStepsBefore + kStepsAfter);
    check_same(whole_parameters(resumed, dir / "resumed.safetensors"), reference,
               "resumed under " + layout.str() + " from save " + std::to_string(static_cast<int>(kind)));
  }
}

TEST_CASE("checkpoint layouts: under mixed precision the masters are saved, and resume exactly", "[layouts]") {
  JobDirectory dir;
  const int tp = default_tp();
  Trainer saved({tp, "zero2", /*mixed_precision=*/true});
  saved.train(0, kStepsBefore);
  save(saved, SaveKind::kDirectory, dir);
  save(saved, SaveKind::kAsync, dir);
  saved.train(kStepsBefore, kStepsBefore + kStepsAfter);
  const auto reference = whole_parameters(saved, dir / "reference.safetensors");

  Trainer resumed({tp, "zero3", true});
  load(resumed, SaveKind::kDirectory, dir);
  resumed.train(kStepsBefore, kStepsBefore + kStepsAfter);
  check_same(whole_parameters(resumed, dir / "resumed.safetensors"), reference, "resumed at ZeRO-3, mixed precision");
  // ZeRO-2 here. Until 2026-12-06 ZeRO-1 all-reduced the float32 gradients where ZeRO-2 and 3
  // reduce-scattered them, another summation order in float32 (5.6e-9 apart after 3 steps at
  // {dp 3}), which says nothing about the checkpoint; now all three reduce-scatter.
  Trainer resumed_async({tp, "zero2", true});
  load(resumed_async, SaveKind::kAsync, dir);
  resumed_async.train(kStepsBefore, kStepsBefore + kStepsAfter);
  check_same(whole_parameters(resumed_async, dir / "resumed.safetensors"), reference,
             "resumed at ZeRO-2 from the background save, mixed precision");
}

// The earlier formats through the same view. save_sharded_checkpoint's files hold rows of the whole
// tensors (FSDP's own shards as they are; a tensor-parallel split gathered first; DDP all rows in
// one file), so a save at any {dp, tp} layout and wrapper resumes at any other, the AdamW moments
// with it.
TEST_CASE("checkpoint layouts: the earlier sharded format saved at {dp, tp} ZeRO-3 and DDP resumes under every "
          "other layout", "[layouts]") {
  JobDirectory dir;
  const int tp = default_tp();
  for (const Layout& from : {Layout{tp, "zero3"}, Layout{tp, "ddp"}, Layout{tp, "zero2", true}}) {
    Trainer saved(from);
    saved.train(0, kStepsBefore);
    save(saved, SaveKind::kEarlierSharded, dir);
    saved.train(kStepsBefore, kStepsBefore + kStepsAfter);
    const auto reference = whole_parameters(saved, dir / "reference.safetensors");
    // Under mixed precision (float32 compute over float64 masters) the files hold the masters:
    // resumed with mixed precision, the run goes on exactly (a save of the compute copies would not).
    const std::vector<Layout> resumes =
        from.mixed_precision ? std::vector<Layout>{{tp, "zero3", true}}
                             : std::vector<Layout>{{tp, "zero1"}, {tp, "ddp"}, {1, "zero3"}, {1, "ddp"}, {1, "none"}};
    for (const Layout& to : resumes) {
      Trainer resumed(to);
      load(resumed, SaveKind::kEarlierSharded, dir);
      resumed.train(kStepsBefore, kStepsBefore + kStepsAfter);
      check_same(whole_parameters(resumed, dir / "resumed.safetensors"), reference,
                 "the earlier sharded format saved under " + from.str() + ", resumed under " + to.str());
    }
    cpprun::barrier(group());  // every rank has read the files before the next save replaces them
  }
}

namespace {

// Every tensor of a torch::save archive (parameters and buffers, by dotted name, submodules
// followed recursively), as torch::load would read them, for comparing two archives.
void archive_tensors(torch::serialize::InputArchive& archive, const std::string& prefix,
                     std::map<std::string, at::Tensor>& out) {
  for (const std::string& key : archive.keys()) {
    at::Tensor tensor;
    torch::serialize::InputArchive child;
    if (archive.try_read(key, tensor)) {
      out[prefix + key] = tensor;
    } else if (archive.try_read(key, child)) {
      archive_tensors(child, prefix + key + ".", out);
    }
  }
}
std::map<std::string, at::Tensor> archive_tensors(const std::string& path) {
  torch::serialize::InputArchive archive;
  archive.load_from(path);
  std::map<std::string, at::Tensor> out;
  archive_tensors(archive, "", out);
  return out;
}

}  // namespace

// save_full_state_dict's TorchScript archive at every layout is what torch::save of the unsplit
// model writes, tensor for tensor (the masters under mixed precision); and an archive as the
// earlier code wrote it (torch::save of a plain module, with and without cpprun's checksum footer)
// loads into every layout exactly.
TEST_CASE("checkpoint layouts: the earlier whole-model archive is the unsplit model's torch::save at every layout, "
          "and loads into each", "[layouts]") {
  JobDirectory dir;
  const int tp = default_tp();
  // The earlier files: a plain stack trained alike on every rank, as the earlier code saved it.
  Trainer plain({1, "none"});
  plain.train(0, 2);
  std::map<std::string, at::Tensor> expected;
  for (const auto& item : plain.net->named_parameters()) expected[item.key()] = item.value().detach().clone();
  if (group().rank() == 0) {
    torch::save(plain.net, dir / "torch_save.pt");
    torch::serialize::OutputArchive archive;
    plain.net->save(archive);
    cpprun::save_checkpoint(archive, dir / "checked.pt");
  }
  cpprun::barrier(group());
  const std::vector<Layout> layouts{{tp, "zero3"}, {tp, "zero1"}, {tp, "ddp"},       {1, "zero2"},
                                    {1, "ddp"},    {1, "none"},   {tp, "zero2", true}};
  for (const Layout& layout : layouts) {
    INFO(layout.str());
    for (const std::string file : {"torch_save.pt", "checked.pt"}) {
      Trainer loaded(layout);
      loaded.on_model([&](auto& m) { cpprun::load_full_state_dict(m, dir / file); });
      const auto whole = whole_parameters(loaded, dir / "loaded.safetensors");
      REQUIRE(whole.size() == expected.size());
      for (const auto& [name, tensor] : expected) {
        INFO(file << " into " << layout.str() << ": " << name);
        CHECK(whole.at(name).equal(tensor));
      }
    }
    // Trained on, then saved: the archive is, tensor for tensor, torch::save of an unsplit stack
    // holding the same values (float64: under mixed precision the masters, not float32 copies).
    Trainer trained(layout);
    trained.train(0, 2);
    const std::string archive = dir / "archive.pt";
    trained.on_model([&](auto& m) {
      if (layout.how == "none") {
        if (group().rank() == 0) cpprun::save_full_state_dict(m, archive);
      } else {
        cpprun::save_full_state_dict(m, archive);
      }
    });
    const auto values = whole_parameters(trained, dir / "trained.safetensors");
    if (group().rank() == 0) {
      Stack unsplit;
      {
        torch::NoGradGuard no_grad;
        for (const auto& item : unsplit->named_parameters()) item.value().copy_(values.at(item.key()));
      }
      torch::save(unsplit, dir / "unsplit.pt");
    }
    cpprun::barrier(group());
    const auto ours = archive_tensors(archive), theirs = archive_tensors(dir / "unsplit.pt");
    REQUIRE(ours.size() == theirs.size());
    for (const auto& [name, tensor] : theirs) {
      INFO(layout.str() << ": " << name);
      REQUIRE(ours.count(name) == 1);
      CHECK(ours.at(name).scalar_type() == tensor.scalar_type());
      CHECK(ours.at(name).sizes() == tensor.sizes());
      CHECK(ours.at(name).equal(tensor));
    }
    Stack reader;  // and a plain stack reads it with torch::load, in float64
    torch::load(reader, archive);
    for (const auto& item : reader->named_parameters()) {
      INFO(layout.str() << ": " << item.key());
      CHECK(item.value().scalar_type() == at::kDouble);
      CHECK(item.value().equal(values.at(item.key())));
    }
    cpprun::barrier(group());  // every rank has read the files before the next layout writes them
  }

  // Another model's archive (one block of the two, other values): refused on every rank, the root
  // listing what the file lacks, and nothing loaded, not even the block that fits.
  const std::string other = dir / "other.pt";
  if (group().rank() == 0) {
    auto one_block = std::make_shared<torch::nn::Module>();
    torch::nn::ModuleList h;
    h->push_back(torch::nn::Sequential(torch::nn::LayerNorm(torch::nn::LayerNormOptions({kHidden})),
                                       torch::nn::Linear(kHidden, 4 * kHidden), torch::nn::GELU(),
                                       torch::nn::Linear(4 * kHidden, kHidden)));
    one_block->register_module("h", h);
    one_block->to(torch::kDouble);
    torch::save(one_block, other);
  }
  cpprun::barrier(group());
  Trainer refused({tp, "ddp"});  // its replicated tensors are the module's own, which a load writes in place
  refused.train(0, 1);           // every tensor differs from the file's and from its initial value
  const auto before = whole_parameters(refused, dir / "before.safetensors");
  std::string message = "(nothing thrown)";
  try {
    refused.on_model([&](auto& m) { cpprun::load_full_state_dict(m, other); });
  } catch (const std::exception& e) {
    message = e.what();
  }
  // Rank 0 reads; every rank throws its error (the others with "(raised on rank 0)").
  CHECK_THAT(message, Catch::Contains(other + " does not fit this model (1 difference(s)): missing the submodule "
                                      "\"h.1\". Nothing was loaded."));
  const auto after = whole_parameters(refused, dir / "after.safetensors");
  for (const auto& [name, tensor] : before) CHECK(after.at(name).equal(tensor));
}
