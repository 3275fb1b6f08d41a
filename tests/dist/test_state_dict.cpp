// State dicts through DDP and FSDP (cpprun/state_dict.h): what a wrapper saves is what the plain
// module holds; what a wrapper loads is what the plain module would, on every rank, and the
// sharded model computes with it; a file of other shapes is refused on every rank, each raising
// rank 0's error. Under mixed precision FSDP saves and loads the fp32 masters. The same for
// directories in Hugging Face's sharded layout, which each rank writes its share of (with rank 0's
// buffers, as in a file, though the ranks' BatchNorm statistics differ); and (run by
// hf_sharded_reshard.sh) a directory saved on 4 ranks loads bit-exactly on 1 to 3.
#include "catch.h"
#include <torch/torch.h>
#include <unistd.h>  // getppid

#include <cstdio>
#include <fstream>
#include <iterator>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include "checkpoint/sharded_state_dict.h"
#include "checkpoint/state_dict.h"
#include "cpprun/cpprun.h"
#include "dist_test_support.h"
#include "support/safetensors.h"
#include "support/safetensors_index.h"

namespace {

using dist_test::group;

// Two Linears and a buffer (state dicts carry buffers too).
struct Net : torch::nn::Module {
  explicit Net(int64_t hidden = 13) {
    fc1 = register_module("fc1", torch::nn::Linear(8, hidden));
    fc2 = register_module("fc2", torch::nn::Linear(hidden, 4));
    scale = register_buffer("scale", torch::rand({4}));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::relu(fc1(x))) * scale; }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::Tensor scale;
};

bool is_linear(const torch::nn::Module& m) { return m.as<torch::nn::Linear>() != nullptr; }

// The same Net on every rank: seeded.
std::shared_ptr<Net> seeded(int seed, int64_t hidden = 13) {
  torch::manual_seed(seed);
  return std::make_shared<Net>(hidden);
}

void check_same_state(Net& a, Net& b) {
  auto pa = a.named_parameters();
  auto pb = b.named_parameters();
  REQUIRE(pa.size() == pb.size());
  for (const auto& item : pa) CHECK(torch::equal(item.value(), pb[item.key()]));
  CHECK(torch::equal(a.scale, b.scale));
}

template <typename Wrapper>
void check_wrapper(Wrapper& model, const std::string& kind) {
  const int rank = group().rank();
  const std::string base = "/tmp/cpprun_state_dict_" + kind + "_" + std::to_string(::getppid());
  int holds_seed = 1;  // what the wrapper's model holds
  for (const std::string ext : {".pt", ".safetensors"}) {
    INFO(kind << ext);
    const std::string saved = base + "_saved" + ext;
    const std::string source = base + "_source" + ext;
    const std::string other = base + "_other" + ext;
    // Save: every rank reads rank 0's file back into a plain module; it is the model's.
    cpprun::save_state_dict(model, saved);
    auto plain = seeded(7);
    cpprun::load_state_dict(plain, saved);
    check_same_state(*plain, *seeded(holds_seed));

    // Load: rank 0's seed-2 file; the wrapper computes what the plain seed-2 module computes.
    if (rank == 0) cpprun::save_state_dict(seeded(2), source);  // only rank 0 reads it
    const auto report = cpprun::load_state_dict(model, source);
    CHECK(report.missing_keys.empty());
    torch::manual_seed(3);
    const auto x = torch::randn({6, 8});
    {
      torch::NoGradGuard no_grad;
      CHECK(torch::allclose(model->forward(x), seeded(2)->forward(x)));
    }
    cpprun::save_state_dict(model, saved);
    auto reloaded = seeded(7);
    cpprun::load_state_dict(reloaded, saved);
    check_same_state(*reloaded, *seeded(2));

    // Other shapes: refused on every rank, naming the file; the model is unchanged.
    if (rank == 0) cpprun::save_state_dict(seeded(4, 9), other);
    std::string message = "(no error)";
    try {
      cpprun::load_state_dict(model, other);
    } catch (const std::exception& e) {
      message = e.what();
    }
    CHECK_THAT(message, Catch::Matchers::Contains(other));
    // Every rank raises rank 0's list, not only that rank 0 failed.
    CHECK_THAT(message, Catch::Matchers::Contains("fc1.weight: file float32 [9, 8], module float32 [13, 8]"));
    {
      torch::NoGradGuard no_grad;
      CHECK(torch::allclose(model->forward(x), seeded(2)->forward(x)));
    }
    // strict(false): the same report on every rank; what fits is loaded, and what does not is said
    // on stderr by the team's first rank, where PyTorch's would cast another dtype.
    std::ostringstream said;
    struct Restore {  // std::cerr's own buffer back, however the load ends
      std::streambuf* console;
      ~Restore() { std::cerr.rdbuf(console); }
    } restore{std::cerr.rdbuf(said.rdbuf())};
    const auto lenient = cpprun::load_state_dict(model, other, cpprun::StateDictOptions().strict(false));
    std::cerr.rdbuf(restore.console);
    CHECK(lenient.mismatched.size() == 3);  // fc1.weight, fc1.bias, fc2.weight
    CHECK(lenient.missing_keys.empty());
    CHECK((said.str().find("left 3 tensor(s) of the module as they were") != std::string::npos) == (rank == 0));
    if (rank == 0) {
      CHECK_THAT(said.str(), Catch::Matchers::Contains("fc1.weight: file float32 [9, 8], module float32 [13, 8]"));
    }
    cpprun::load_state_dict(model, source);
    holds_seed = 2;
    cpprun::barrier(group());
    if (rank == 0) {
      for (const auto& file : {saved, source, other}) std::remove(file.c_str());
    }
  }
}

}  // namespace

TEST_CASE("state_dict: DDP saves and loads as the plain module", "[state_dict]") {
  auto model = cpprun::DistributedDataParallel(seeded(1), group());
  check_wrapper(model, "ddp");
}

TEST_CASE("state_dict: FSDP saves and loads as the plain module, at every stage", "[state_dict]") {
  const int stage = GENERATE(1, 3);
  auto model = cpprun::FullyShardedDataParallel(seeded(1), group(),
                                                cpprun::FsdpOptions().stage(stage).wrap_policy(is_linear));
  check_wrapper(model, "fsdp" + std::to_string(stage));
}

namespace {

using Model = cpprun::DataParallel<Net>;
using NamedTensors = cpprun::detail::NamedTensors;
// FSDP (or HSDP) of a Net with these options; `shard_rank` / `shard_world`: this rank's place in
// its shard group.
struct FsdpMaker {
  std::function<Model(std::shared_ptr<Net>, cpprun::FsdpOptions)> make;
  int shard_rank, shard_world;
};

cpprun::FsdpOptions fsdp_options(int stage, bool bf16) {
  auto options = cpprun::FsdpOptions().stage(stage).wrap_policy(is_linear);
  if (bf16) options.param_dtype(torch::kBFloat16);
  return options;
}

// Steps [first, first + count): the same batch on every rank.
void train(Model& model, torch::optim::Optimizer& opt, int first, int count) {
  for (int step = first; step < first + count; ++step) {
    torch::manual_seed(500 + step);
    const auto x = torch::randn({8, 8}), y = torch::randn({8, 4});
    opt.zero_grad();
    torch::mse_loss(model->forward(x), y).backward();
    opt.step();
  }
}

NamedTensors read_saved(const std::string& path) {
  if (path.back() == '/') return cpprun::detail::read_sharded_directory(path, cpprun::detail::kModelStem).tensors;
  return cpprun::detail::read_state_dict_file(path);
}

void check_same_tensors(const NamedTensors& a, const NamedTensors& b) {
  std::map<std::string, torch::Tensor> in_b(b.begin(), b.end());
  REQUIRE(a.size() == b.size());
  for (const auto& [name, tensor] : a) {
    INFO(name);
    REQUIRE(in_b.count(name) == 1);
    CHECK(tensor.scalar_type() == in_b.at(name).scalar_type());
    CHECK(torch::equal(tensor, in_b.at(name)));
  }
}

// The file's rows of each parameter are, bit for bit, this rank's fp32 master shard.
void check_holds_masters(const NamedTensors& file, Model& model, const FsdpMaker& fsdp) {
  std::map<std::string, torch::Tensor> by_name(file.begin(), file.end());
  for (const auto& item : model->named_parameters()) {
    INFO(item.key());
    REQUIRE(by_name.count(item.key()) == 1);
    const torch::Tensor& whole = by_name.at(item.key());
    CHECK(whole.scalar_type() == torch::kFloat);
    CHECK(item.value().scalar_type() == torch::kFloat);
    const int64_t rows = whole.size(0), per_rank = (rows + fsdp.shard_world - 1) / fsdp.shard_world;
    const int64_t first = std::min(fsdp.shard_rank * per_rank, rows);
    CHECK(torch::equal(whole.narrow(0, first, item.value().size(0)), item.value().detach()));
  }
}

// Under mixed precision (bf16 compute copies, fp32 masters) at `stage`: saves hold the fp32
// masters, named and typed as the same model's without mixed precision; loads reach the masters
// and the compute copies, at another stage, with or without mixed precision.
void check_mixed_precision(const FsdpMaker& fsdp, int stage, int other_stage, const std::string& kind) {
  const int rank = group().rank();
  const std::string base = "/tmp/cpprun_state_dict_mp_" + kind + "_" + std::to_string(::getppid());
  Model model = fsdp.make(seeded(1), fsdp_options(stage, true));
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(0.01));
  train(model, opt, 0, 3);

  // What the same Net saves without mixed precision: the names and dtypes to match.
  const std::string reference = base + "_reference.safetensors";
  if (rank == 0) cpprun::save_state_dict(seeded(1), reference);
  cpprun::barrier(group());
  const NamedTensors expected_kinds = read_saved(reference);

  const std::string file = base + "_saved.safetensors";
  for (const std::string& path : {file, base + "_saved.pt", base + "_saved/"}) {
    INFO(kind << " saves " << path);
    cpprun::save_state_dict(model, path);
    const NamedTensors saved = read_saved(path);
    check_holds_masters(saved, model, fsdp);
    REQUIRE(saved.size() == expected_kinds.size());
    std::map<std::string, torch::Tensor> kinds(expected_kinds.begin(), expected_kinds.end());
    for (const auto& [name, tensor] : saved) {
      INFO(name);
      REQUIRE(kinds.count(name) == 1);
      CHECK(tensor.scalar_type() == kinds.at(name).scalar_type());
      CHECK(tensor.sizes() == kinds.at(name).sizes());
    }
    // save_async writes the same tensors.
    const std::string async_path = path.back() == '/' ? base + "_async/" : base + "_async" + path.substr(path.rfind('.'));
    cpprun::save_async(model, async_path).wait();
    check_same_tensors(read_saved(async_path), saved);
  }
  const std::string optimizer_file = base + "_optimizer.safetensors";
  cpprun::save_optimizer_state_dict(model, opt, optimizer_file);
  // The earlier whole-model archive (torch::save's format) holds the fp32 masters too, not the bf16
  // compute copies its module holds: a plain fp32 Net torch::loads them, and a fresh bf16 model
  // loads them back into its masters, bit for bit.
  {
    const std::string archive = base + "_full.pt";
    cpprun::save_full_state_dict(model, archive);
    auto plain = seeded(7);
    torch::load(plain, archive);
    NamedTensors in_archive;
    for (const auto& item : plain->named_parameters()) in_archive.emplace_back(item.key(), item.value().detach());
    check_holds_masters(in_archive, model, fsdp);
    Model loaded = fsdp.make(seeded(9), fsdp_options(stage, true));
    cpprun::load_full_state_dict(loaded, archive);
    check_holds_masters(in_archive, loaded, fsdp);
  }
  {  // the model and its optimizer as one asynchronous save: the masters, and the same optimizer state
    const std::string async_model = base + "_async_both.safetensors", async_opt = base + "_async_both_opt.safetensors";
    cpprun::save_async(model, opt, async_model, async_opt).wait();
    check_same_tensors(read_saved(async_model), read_saved(file));
    check_same_tensors(read_saved(async_opt), read_saved(optimizer_file));
  }

  // Loaded into a fresh bf16 model at the same stage with the optimizer's state: both continue alike.
  {
    Model resumed = fsdp.make(seeded(9), fsdp_options(stage, true));
    torch::optim::Adam resumed_opt(resumed->parameters(), torch::optim::AdamOptions(0.5));
    const auto report = cpprun::load_state_dict(resumed, file);
    CHECK(report.missing_keys.empty());
    cpprun::load_optimizer_state_dict(resumed, resumed_opt, optimizer_file);
    train(model, opt, 3, 2);
    train(resumed, resumed_opt, 3, 2);
    auto a = model->named_parameters();
    for (const auto& item : resumed->named_parameters()) {
      INFO(item.key());
      CHECK(torch::equal(item.value(), a[item.key()]));
    }
    cpprun::save_state_dict(model, file);  // what the later loads compare with
  }
  const NamedTensors masters = read_saved(file);

  // Into a plain module, and into FSDP at another stage with and without mixed precision, from a
  // file and a directory: saved again, each gives the masters back bit for bit; the bf16 model
  // computes what the plain module cast to bf16 computes.
  auto plain = seeded(7);
  cpprun::load_state_dict(plain, file);
  torch::manual_seed(3);
  const auto x = torch::randn({6, 8});
  cpprun::save_state_dict(model, base + "_saved/");
  for (const std::string& source : {file, base + "_saved/"}) {
    for (const bool bf16 : {true, false}) {
      INFO(kind << ": loads " << source << " at stage " << other_stage << (bf16 ? " in bf16" : " in fp32"));
      Model loaded = fsdp.make(seeded(9), fsdp_options(other_stage, bf16));
      cpprun::load_state_dict(loaded, source);
      const std::string again = base + "_again.safetensors";
      cpprun::save_state_dict(loaded, again);
      check_same_tensors(read_saved(again), masters);
      torch::NoGradGuard no_grad;
      if (bf16) {  // the layers in bf16, the (fp32) buffer as it is
        auto cast = seeded(7);
        cpprun::load_state_dict(cast, file);
        cast->fc1->to(torch::kBFloat16);
        cast->fc2->to(torch::kBFloat16);
        const auto expected = cast->forward(x.to(torch::kBFloat16));
        CHECK(torch::allclose(loaded->forward(x).to(torch::kFloat), expected.to(torch::kFloat), 1e-2, 1e-2));
      } else {
        CHECK(torch::allclose(loaded->forward(x), plain->forward(x)));
      }
    }
  }

  // The other way: a model without mixed precision saves; the bf16 model loads its fp32 values.
  {
    Model fp32 = fsdp.make(seeded(2), fsdp_options(stage, false));
    const std::string fp32_file = base + "_fp32.pt";
    cpprun::save_state_dict(fp32, fp32_file);
    Model loaded = fsdp.make(seeded(9), fsdp_options(other_stage, true));
    cpprun::load_state_dict(loaded, fp32_file);
    check_holds_masters(read_saved(fp32_file), loaded, fsdp);
  }

  // Another model's file: refused on every rank with rank 0's list; the masters are unchanged.
  const std::string other = base + "_other.safetensors";
  if (rank == 0) cpprun::save_state_dict(seeded(4, 9), other);
  CHECK_THROWS_WITH(cpprun::load_state_dict(model, other),
                    Catch::Matchers::Contains("fc1.weight: file float32 [9, 8], module float32 [13, 8]"));
  check_holds_masters(masters, model, fsdp);
  // strict(false): what fits (fc2.bias, the buffer) reaches the masters; the rest stays.
  const auto lenient = cpprun::load_state_dict(model, other, cpprun::StateDictOptions().strict(false));
  CHECK(lenient.mismatched.size() == 3);  // fc1.weight, fc1.bias, fc2.weight
  NamedTensors mixed = masters;
  std::map<std::string, torch::Tensor> in_other;
  for (const auto& [name, tensor] : read_saved(other)) in_other.emplace(name, tensor);
  for (auto& [name, tensor] : mixed) {
    if (name == "fc2.bias" || name == "scale") tensor = in_other.at(name);
  }
  check_holds_masters(mixed, model, fsdp);

  cpprun::barrier(group());
  if (rank == 0) {
    for (const auto& entry : std::filesystem::directory_iterator("/tmp")) {
      if (entry.path().string().rfind(base, 0) == 0) std::filesystem::remove_all(entry.path());
    }
  }
}

}  // namespace

TEST_CASE("state_dict: FSDP under mixed precision saves and loads the fp32 masters", "[state_dict]") {
  const int stage = GENERATE(2, 3);
  const FsdpMaker fsdp{[](std::shared_ptr<Net> net, cpprun::FsdpOptions options) {
                         return Model(cpprun::FullyShardedDataParallel(std::move(net), group(), options));
                       },
                       group().rank(), group().size()};
  check_mixed_precision(fsdp, stage, stage == 2 ? 3 : 1, "fsdp" + std::to_string(stage));
}

TEST_CASE("state_dict: HSDP (2 replicas x 2 shards) under mixed precision saves and loads the fp32 masters",
          "[state_dict]") {
  if (group().size() != 4) return;  // the 2x2 mesh needs 4 ranks
  const cpprun::DeviceMesh mesh(group(), std::vector<int>{2, 2}, std::vector<std::string>{"replicate", "shard"});
  const FsdpMaker fsdp{[&mesh](std::shared_ptr<Net> net, cpprun::FsdpOptions options) {
                         return Model(cpprun::FullyShardedDataParallel(std::move(net), mesh, options));
                       },
                       group().rank() % 2, 2};
  check_mixed_precision(fsdp, 3, 2, "hsdp");
}

namespace {

// What `run` throws on this rank: its type's name and message.
std::pair<std::string, std::string> error_of(const std::function<void()>& run) {
  try {
    run();
  } catch (const cpprun::StateDictMismatchError& e) {
    return {"mismatch", e.what()};
  } catch (const cpprun::CorruptCheckpointError& e) {
    return {"corrupt", e.what()};
  } catch (const std::exception& e) {
    return {"other", e.what()};
  }
  return {"none", ""};
}

// What load_state_dict(model, path) throws on this rank.
template <typename Wrapper>
std::pair<std::string, std::string> load_error(Wrapper& model, const std::string& path) {
  return error_of([&] { cpprun::load_state_dict(model, path); });
}

template <typename Wrapper>
void check_load_faults(Wrapper& model, const std::string& kind) {
  const int rank = group().rank();
  const std::string base = "/tmp/cpprun_state_dict_fault_" + kind + "_" + std::to_string(::getppid());
  const std::string missing = base + "_missing.safetensors", shape = base + "_shape.pt";
  const std::string damaged = base + "_damaged.safetensors", absent = base + "_absent.safetensors";
  if (rank == 0) {
    // Net's names but fc2.bias.
    auto partial = std::make_shared<torch::nn::Module>();
    partial->register_module("fc1", torch::nn::Linear(8, 13));
    auto fc2 = std::make_shared<torch::nn::Module>();
    fc2->register_parameter("weight", torch::zeros({4, 13}));
    partial->register_module("fc2", fc2);
    partial->register_buffer("scale", torch::ones({4}));
    cpprun::save_state_dict(partial, missing);
    cpprun::save_state_dict(seeded(4, 9), shape);
    cpprun::save_state_dict(seeded(2), damaged);
    std::filesystem::resize_file(damaged, std::filesystem::file_size(damaged) - 7);
  }
  cpprun::barrier(group());
  INFO(kind << " on rank " << rank);
  {  // A missing key: rank 0's list on every rank, as a StateDictMismatchError.
    const auto [type, message] = load_error(model, missing);
    CHECK(type == "mismatch");
    CHECK_THAT(message, Catch::Matchers::Contains("missing from the file (1): fc2.bias"));
    CHECK_THAT(message, Catch::Matchers::Contains(missing));
  }
  {  // Shape mismatch.
    const auto [type, message] = load_error(model, shape);
    CHECK(type == "mismatch");
    CHECK_THAT(message, Catch::Matchers::Contains("fc1.weight: file float32 [9, 8], module float32 [13, 8]"));
  }
  {  // A damaged file: a CorruptCheckpointError naming it, on every rank.
    const auto [type, message] = load_error(model, damaged);
    CHECK(type == "corrupt");
    CHECK_THAT(message, Catch::Matchers::Contains("safetensors file " + damaged));
  }
  {  // No file: the reason, with the path.
    const auto [type, message] = load_error(model, absent);
    CHECK(type == "other");
    CHECK_THAT(message, Catch::Matchers::Contains(absent + " does not exist"));
  }
  if (rank != 0) {  // the others say where the error came from
    CHECK_THAT(load_error(model, shape).second, Catch::Matchers::Contains("(raised on rank 0)"));
  } else {
    CHECK_THAT(load_error(model, shape).second, !Catch::Matchers::Contains("(raised on rank 0)"));
  }
  cpprun::barrier(group());
  if (rank == 0) {
    for (const auto& file : {missing, shape, damaged}) std::remove(file.c_str());
  }
}

}  // namespace

TEST_CASE("state_dict: a load that fails on rank 0 raises rank 0's error, of its kind, on every rank",
          "[state_dict]") {
  const int stage = GENERATE(0, 3, 4);  // 0: DDP; 4: FSDP stage 2 under mixed precision
  if (stage == 0) {
    auto model = cpprun::DistributedDataParallel(seeded(1), group());
    check_load_faults(model, "ddp");
  } else {
    auto options = cpprun::FsdpOptions().stage(stage == 4 ? 2 : stage).wrap_policy(is_linear);
    if (stage == 4) options.param_dtype(torch::kBFloat16);
    auto model = cpprun::FullyShardedDataParallel(seeded(1), group(), options);
    check_load_faults(model, "fsdp" + std::to_string(stage));
  }
}

TEST_CASE("state_dict: HSDP (2 replicas x 2 shards) saves and loads as the plain module", "[state_dict]") {
  if (group().size() != 4) return;  // the 2x2 mesh needs 4 ranks
  const cpprun::DeviceMesh mesh(group(), std::vector<int>{2, 2}, std::vector<std::string>{"replicate", "shard"});
  auto model =
      cpprun::FullyShardedDataParallel(seeded(1), mesh, cpprun::FsdpOptions().stage(3).wrap_policy(is_linear));
  check_wrapper(model, "hsdp");
}

TEST_CASE("state_dict: DataParallel<Net> (either wrapper, one type) saves and loads", "[state_dict]") {
  cpprun::DataParallel<Net> model =
      cpprun::FullyShardedDataParallel(seeded(1), group(), cpprun::FsdpOptions().stage(2));
  check_wrapper(model, "dataparallel");
}

namespace {

// The shard files DIR's index names, each checked to carry the index's save id and `step`.
std::set<std::string> checked_shard_files(const std::string& dir, int64_t step) {
  namespace fs = std::filesystem;
  const fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  std::ifstream in(index_path);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto index = cpprun::detail::read_safetensors_index(text, index_path.string());
  std::set<std::string> files;
  for (const auto& [name, file] : index.weight_map) files.insert(file);
  for (const auto& file : files) {
    std::ifstream shard(fs::path(dir) / file, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(shard)), std::istreambuf_iterator<char>());
    const auto parsed = cpprun::detail::read_safetensors(bytes, file);
    CHECK(parsed.metadata.at("cpprun_save_id") == index.metadata.at("cpprun_save_id"));
    CHECK(parsed.metadata.at("cpprun_step") == std::to_string(step));
  }
  return files;
}

template <typename Wrapper>
void check_sharded_wrapper(Wrapper& model, const std::string& kind) {
  const int rank = group().rank(), world = group().size();
  const std::string base = "/tmp/cpprun_hf_sharded_" + kind + "_" + std::to_string(::getppid());
  const std::string saved = base + "_saved/", source = base + "_source/";
  INFO(kind);
  // Save: every rank writes its share; every rank reads the whole directory into a plain module.
  cpprun::save_state_dict(model, saved, cpprun::StateDictSaveOptions().step(11));
  auto plain = seeded(7);
  cpprun::load_state_dict(plain, saved);
  check_same_state(*plain, *seeded(1));
  const auto files = checked_shard_files(saved, 11);
  CHECK(files.size() == static_cast<std::size_t>(std::min(world, 5)));  // Net has 5 tensors
  CHECK(files.count(cpprun::detail::shard_file_name(1, static_cast<int>(files.size()))) == 1);

  // Load: a directory rank 0 wrote alone; the wrapper computes what the plain seed-2 module does.
  if (rank == 0) cpprun::save_state_dict(seeded(2), source);
  cpprun::load_state_dict(model, source);
  torch::manual_seed(3);
  const auto x = torch::randn({6, 8});
  {
    torch::NoGradGuard no_grad;
    CHECK(torch::allclose(model->forward(x), seeded(2)->forward(x)));
  }
  // Another model's directory: refused on every rank, naming it; rank 0 lists the files.
  if (rank == 0) cpprun::save_state_dict(seeded(4, 9), source);
  std::string message = "(no error)";
  try {
    cpprun::load_state_dict(model, source);
  } catch (const std::exception& e) {
    message = e.what();
  }
  CHECK_THAT(message, Catch::Matchers::Contains(base + "_source"));
  CHECK_THAT(message, Catch::Matchers::Contains("fc1.weight: file float32 [9, 8], module float32 [13, 8] "
                                                "(in model-00001-of-00001.safetensors)"));
  cpprun::barrier(group());
  if (rank == 0) {
    std::filesystem::remove_all(saved);
    std::filesystem::remove_all(source);
  }
}

}  // namespace

TEST_CASE("state_dict: DDP and FSDP at every stage save a Hugging Face sharded directory, a share per rank",
          "[state_dict]") {
  const int stage = GENERATE(0, 1, 2, 3);  // 0: DDP
  if (stage == 0) {
    auto model = cpprun::DistributedDataParallel(seeded(1), group());
    check_sharded_wrapper(model, "ddp");
  } else {
    auto model = cpprun::FullyShardedDataParallel(seeded(1), group(),
                                                  cpprun::FsdpOptions().stage(stage).wrap_policy(is_linear));
    check_sharded_wrapper(model, "fsdp" + std::to_string(stage));
  }
}

TEST_CASE("state_dict: HSDP (2 replicas x 2 shards) saves a Hugging Face sharded directory", "[state_dict]") {
  if (group().size() != 4) return;
  const cpprun::DeviceMesh mesh(group(), std::vector<int>{2, 2}, std::vector<std::string>{"replicate", "shard"});
  auto model =
      cpprun::FullyShardedDataParallel(seeded(1), mesh, cpprun::FsdpOptions().stage(3).wrap_policy(is_linear));
  check_sharded_wrapper(model, "hsdp");
}

namespace {

// A Linear then a BatchNorm: its running statistics are buffers each rank updates from its own batch.
struct BnNet : torch::nn::Module {
  BnNet() {
    fc = register_module("fc", torch::nn::Linear(8, 16));  // fc.weight alone fills rank 0's share
    bn = register_module("bn", torch::nn::BatchNorm1d(16));
  }
  torch::Tensor forward(const torch::Tensor& x) { return bn(fc(x)); }
  torch::nn::Linear fc{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
};

std::shared_ptr<BnNet> seeded_bn() {
  torch::manual_seed(1);
  return std::make_shared<BnNet>();
}

// After steps on different batches the ranks' running statistics differ; a directory saved by
// every rank holds rank 0's, exactly as the single file (written by rank 0) does, sync and async.
template <typename Wrapper>
void check_directory_holds_root_buffers(Wrapper& model, const std::string& kind) {
  INFO(kind);
  const int rank = group().rank(), world = group().size();
  torch::optim::SGD optimizer(model->parameters(), 0.1);
  for (int step = 0; step < 2; ++step) {
    torch::manual_seed(100 + rank);  // each rank its own batch
    const auto x = torch::randn({6, 8}) * (rank + 1);
    optimizer.zero_grad();
    model->forward(x).pow(2).sum().backward();
    optimizer.step();
  }
  const torch::Tensor mine = cpprun::get_model_state_dict(model)["bn.running_mean"];
  torch::Tensor root = mine.clone();
  cpprun::broadcast(group(), root, 0);
  if (rank > 0) REQUIRE_FALSE(torch::equal(mine, root));  // else the test proves nothing

  const std::string base = "/tmp/cpprun_root_buffers_" + kind + "_" + std::to_string(::getppid());
  cpprun::save_state_dict(model, base + ".safetensors");
  cpprun::save_state_dict(model, base + "/");
  cpprun::save_async(model, base + "_async/").wait();
  const auto file = cpprun::detail::read_state_dict_file(base + ".safetensors");
  for (const std::string& dir : {base, base + "_async"}) {
    INFO(dir);
    const auto read = cpprun::detail::read_sharded_directory(dir, cpprun::detail::kModelStem);
    // The statistics are in a file rank 0 did not write, or the test proves nothing.
    if (world > 1) {
      CHECK(read.file_of.at("bn.running_mean") != cpprun::detail::shard_file_name(1, std::min(world, 7)));
    }
    check_same_tensors(read.tensors, file);
  }
  for (const auto& [name, tensor] : file) {
    if (name == "bn.running_mean") CHECK(torch::equal(tensor, root));
  }
  // The save took copies: every rank keeps its own statistics.
  CHECK(torch::equal(cpprun::get_model_state_dict(model)["bn.running_mean"], mine));
  cpprun::barrier(group());
  if (rank == 0) {
    std::filesystem::remove_all(base);
    std::filesystem::remove_all(base + "_async");
    std::remove((base + ".safetensors").c_str());
  }
}

}  // namespace

TEST_CASE("state_dict: a sharded directory holds rank 0's buffers, as the single file does", "[state_dict]") {
  const int variant = GENERATE(0, 1, 2);  // DDP with and without broadcast_buffers; FSDP stage 3
  if (variant < 2) {
    auto model = cpprun::DistributedDataParallel(seeded_bn(), group(),
                                                 cpprun::DdpOptions().broadcast_buffers(variant == 0));
    check_directory_holds_root_buffers(model, variant == 0 ? "ddp" : "ddp_unsynced");
  } else {
    auto model = cpprun::FullyShardedDataParallel(seeded_bn(), group(), cpprun::FsdpOptions().stage(3));
    check_directory_holds_root_buffers(model, "fsdp3");
  }
}

// Run by tests/dist/hf_sharded_reshard.sh: CPPRUN_HF_PHASE=save (on 4 ranks) saves FSDP stage 3's
// seed-5 model into CPPRUN_HF_DIR, one file per rank, and the same under bf16 mixed precision
// into CPPRUN_HF_DIR_bf16; =load (on 1 to 3 ranks) loads them into a plain module, DDP, FSDP
// stage 3 and bf16 FSDP stage 2, each equal bit for bit to the seed-5 model.
TEST_CASE("state_dict: a Hugging Face sharded directory saved on 4 ranks loads at another world size",
          "[.hf_reshard]") {
  const char* phase = std::getenv("CPPRUN_HF_PHASE");
  const char* dir_env = std::getenv("CPPRUN_HF_DIR");
  REQUIRE(phase != nullptr);
  REQUIRE(dir_env != nullptr);
  const std::string dir = std::string(dir_env) + "/", bf16_dir = std::string(dir_env) + "_bf16/";
  const int rank = group().rank();
  if (std::string(phase) == "save") {
    REQUIRE(group().size() == 4);
    auto model = cpprun::FullyShardedDataParallel(seeded(5), group(),
                                                  cpprun::FsdpOptions().stage(3).wrap_policy(is_linear));
    cpprun::save_state_dict(model, dir, cpprun::StateDictSaveOptions().step(3));
    CHECK(checked_shard_files(dir, 3).size() == 4);
    // Under mixed precision: the fp32 masters, the seed-5 model's values.
    auto bf16 = cpprun::FullyShardedDataParallel(seeded(5), group(), fsdp_options(3, true));
    cpprun::save_state_dict(bf16, bf16_dir, cpprun::StateDictSaveOptions().step(3));
    CHECK(checked_shard_files(bf16_dir, 3).size() == 4);
    return;
  }
  // The bf16 save loads as the fp32 one; a bf16 FSDP model at this world size takes either.
  auto from_bf16 = seeded(7);
  cpprun::load_state_dict(from_bf16, bf16_dir);
  check_same_state(*from_bf16, *seeded(5));
  for (const std::string& source : {dir, bf16_dir}) {
    auto bf16 = cpprun::FullyShardedDataParallel(seeded(7), group(), fsdp_options(2, true));
    cpprun::load_state_dict(bf16, source);
    const std::string bf16_again = std::string(dir_env) + "_bf16_again_np" + std::to_string(group().size()) + ".pt";
    cpprun::save_state_dict(bf16, bf16_again);
    auto reloaded = seeded(7);
    cpprun::load_state_dict(reloaded, bf16_again);
    check_same_state(*reloaded, *seeded(5));
  }
  auto plain = seeded(7);
  cpprun::load_state_dict(plain, dir);
  check_same_state(*plain, *seeded(5));
  auto ddp = cpprun::DistributedDataParallel(seeded(7), group());
  cpprun::load_state_dict(ddp, dir);
  check_same_state(*ddp->module(), *seeded(5));
  // FSDP keeps only its rows: what it saves again, gathered, is the seed-5 model.
  auto fsdp =
      cpprun::FullyShardedDataParallel(seeded(7), group(), cpprun::FsdpOptions().stage(3).wrap_policy(is_linear));
  cpprun::load_state_dict(fsdp, dir);
  const std::string again = std::string(dir_env) + "_again_np" + std::to_string(group().size()) + ".safetensors";
  cpprun::save_state_dict(fsdp, again);
  auto reloaded = seeded(7);
  cpprun::load_state_dict(reloaded, again);
  check_same_state(*reloaded, *seeded(5));
  cpprun::barrier(group());
  if (rank == 0) std::remove(again.c_str());
}

namespace {

using StateDict = torch::OrderedDict<std::string, torch::Tensor>;

// What forward computes on a fixed input: how a test sees which values a wrapper holds.
torch::Tensor output_of(auto& model) {
  torch::manual_seed(3);
  const auto x = torch::randn({6, 8});
  torch::NoGradGuard no_grad;
  return model->forward(x);
}

// Whether `model` holds `state`'s values: its whole state is theirs, exactly (under mixed
// precision the fp32 masters), and it computes what the plain module holding them computes (the
// compute copies were remade; in bf16, to bf16's precision).
template <typename Wrapper>
bool holds(Wrapper& model, const StateDict& state, const std::shared_ptr<Net>& plain, bool bf16) {
  bool same = true;
  for (const auto& item : cpprun::get_model_state_dict(model)) same = same && item.value().equal(state[item.key()]);
  const auto out = output_of(model), plain_out = output_of(plain);
  return same && (bf16 ? torch::allclose(out.to(torch::kFloat), plain_out, 2e-2, 2e-2) : torch::allclose(out, plain_out));
}

// What set_model_state_dict throws on this rank.
template <typename Wrapper>
std::pair<std::string, std::string> set_error(Wrapper& model, const StateDict& state,
                                              const cpprun::StateDictOptions& options = {}) {
  return error_of([&] { cpprun::set_model_state_dict(model, state, options); });
}

// get_model_state_dict / set_model_state_dict: the whole state in memory. `model` holds
// seeded(1)'s values; `bf16`: it computes in bf16 (its state is the fp32 masters).
template <typename Wrapper>
void check_in_memory(Wrapper& model, const std::string& kind, bool bf16) {
  INFO(kind << " on rank " << group().rank());
  const int rank = group().rank();
  auto plain = seeded(1);
  const StateDict expected = cpprun::get_model_state_dict(plain);  // a plain module: this process alone
  REQUIRE(expected.size() == 5);                                   // 4 parameters and the buffer

  // Every rank gets every whole tensor, by the plain module's names in its order, detached.
  const StateDict state = cpprun::get_model_state_dict(model);
  REQUIRE(state.keys() == expected.keys());
  for (const auto& item : expected) {
    INFO(item.key());
    CHECK(state[item.key()].equal(item.value()));  // the fp32 values, exactly
    CHECK_FALSE(state[item.key()].requires_grad());
  }
  // cpu_offload: rank 0 alone holds them.
  const StateDict offloaded = cpprun::get_model_state_dict(model, cpprun::StateDictOptions().cpu_offload(true));
  CHECK(offloaded.size() == (rank == 0 ? expected.size() : 0));
  for (const auto& item : offloaded) CHECK(item.value().equal(expected[item.key()]));
  CHECK_THROWS_WITH(cpprun::get_model_state_dict(model, cpprun::StateDictOptions().file_key_prefix("model.")),
                    Catch::Contains("file_key_prefix applies to loads"));

  // set: every rank its whole dict; the wrapper then computes what the plain module does.
  const StateDict two = cpprun::get_model_state_dict(seeded(2));
  CHECK(cpprun::set_model_state_dict(model, two).missing_keys.empty());
  CHECK(holds(model, two, seeded(2), bf16));

  // broadcast_from_rank0: only rank 0's dict is read; on the GPU's device or the CPU alike.
  const StateDict five = cpprun::get_model_state_dict(seeded(5));
  cpprun::set_model_state_dict(model, rank == 0 ? five : StateDict(),
                               cpprun::StateDictOptions().broadcast_from_rank0(true));
  CHECK(holds(model, five, seeded(5), bf16));

  // Other shapes: refused on every rank, listing the difference (the others: rank 0's list);
  // nothing changed.
  const StateDict nine = cpprun::get_model_state_dict(seeded(4, 9));
  for (const bool broadcast : {false, true}) {
    const auto [type, message] = set_error(model, nine, cpprun::StateDictOptions().broadcast_from_rank0(broadcast));
    CHECK(type == "mismatch");
    CHECK_THAT(message, Catch::Contains("fc1.weight: file float32 [9, 8], module float32 [13, 8]"));
    CHECK_THAT(message, Catch::Contains("set_model_state_dict"));
  }
  // One rank's dict alone does not fit: every rank refuses before any copies, so no rank's
  // replica takes new values while another keeps its old ones.
  if (group().size() > 1) {
    const bool last = rank == group().size() - 1;
    const auto [type, message] = set_error(model, last ? nine : two);
    CHECK(type == (last ? "mismatch" : "other"));
    CHECK_THAT(message, Catch::Contains(last ? "fc1.weight: file float32 [9, 8]" : "set_model_state_dict failed"));
  }
  CHECK(holds(model, five, seeded(5), bf16));

  // strict(false): what fits is loaded, the rest reported.
  StateDict partial;
  partial.insert("fc2.weight", two["fc2.weight"]);
  partial.insert("fc9.weight", two["fc2.weight"]);
  const auto report = cpprun::set_model_state_dict(model, partial, cpprun::StateDictOptions().strict(false));
  CHECK(report.missing_keys.size() == 4);
  CHECK(report.unexpected_keys == std::vector<std::string>{"fc9.weight"});
  const StateDict after = cpprun::get_model_state_dict(model);
  CHECK(after["fc2.weight"].equal(two["fc2.weight"]));
  CHECK(after["fc1.weight"].equal(five["fc1.weight"]));
  // strict(false) with a name missing on the last rank only: it loaded on the others, the replicas
  // differed for good, each rank with its own report. Refused on every rank; nothing loaded
  // (Note [One report on every rank]).
  if (group().size() > 1) {
    const bool last = rank == group().size() - 1;
    StateDict lacking = partial;
    if (last) lacking.erase("fc2.weight");
    const auto [type, message] = set_error(model, lacking, cpprun::StateDictOptions().strict(false));
    CHECK(type == (last ? "mismatch" : "other"));
    const std::string differ = "the ranks that hold this model were given dicts (or options) that differ";
    CHECK_THAT(message, last ? Catch::Contains(differ) : Catch::Contains("set_model_state_dict failed"));
    CHECK(cpprun::get_model_state_dict(model)["fc2.weight"].equal(two["fc2.weight"]));
    // strict on some ranks and not on the last: the same collectives (a hang otherwise); the
    // strict ranks refuse the missing names, and the last learns that they did.
    const auto [strictness, said] = set_error(model, partial, cpprun::StateDictOptions().strict(!last));
    CHECK(strictness == (last ? "other" : "mismatch"));
  }
}

}  // namespace

TEST_CASE("state_dict: get_model_state_dict and set_model_state_dict hold the whole state in memory",
          "[state_dict]") {
  const int stage = GENERATE(0, 1, 3, 4);  // 0: DDP; 4: ZeRO-3 under mixed precision
  if (stage == 0) {
    auto model = cpprun::DistributedDataParallel(seeded(1), group());
    check_in_memory(model, "ddp", false);
    return;
  }
  auto options = cpprun::FsdpOptions().stage(stage == 4 ? 3 : stage).wrap_policy(is_linear);
  if (stage == 4) options.param_dtype(torch::kBFloat16);
  auto model = cpprun::FullyShardedDataParallel(seeded(1), group(), options);
  check_in_memory(model, "fsdp" + std::to_string(stage), stage == 4);
  if (group().size() == 4) {
    const cpprun::DeviceMesh mesh(group(), std::vector<int>{2, 2}, std::vector<std::string>{"replicate", "shard"});
    auto hsdp = cpprun::FullyShardedDataParallel(seeded(1), mesh, options);
    check_in_memory(hsdp, "hsdp" + std::to_string(stage), stage == 4);
  }
}
