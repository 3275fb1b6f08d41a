// State dicts through DDP and FSDP (cpprun/state_dict.h): what a wrapper saves is what the plain
// module holds; what a wrapper loads is what the plain module would, on every rank, and the
// sharded model computes with it; a file of other shapes is refused on every rank. The same for
// directories in Hugging Face's sharded layout, which each rank writes its share of; and (run by
// hf_sharded_reshard.sh) a directory saved on 4 ranks loads bit-exactly on 1 to 3.
#include <catch2/catch.hpp>
#include <torch/torch.h>
#include <unistd.h>  // getppid

#include <cstdio>
#include <fstream>
#include <iterator>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <string>

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
    if (rank == 0) {
      CHECK_THAT(message, Catch::Matchers::Contains("fc1.weight: file float32 [9, 8], module float32 [13, 8]"));
    }
    {
      torch::NoGradGuard no_grad;
      CHECK(torch::allclose(model->forward(x), seeded(2)->forward(x)));
    }
    // strict(false): the same report on every rank; what fits is loaded.
    const auto lenient = cpprun::load_state_dict(model, other, cpprun::StateDictOptions().strict(false));
    CHECK(lenient.mismatched.size() == 3);  // fc1.weight, fc1.bias, fc2.weight
    CHECK(lenient.missing_keys.empty());
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

TEST_CASE("state_dict: FSDP under mixed precision refuses, rather than saving the compute dtype", "[state_dict]") {
  auto model = cpprun::FullyShardedDataParallel(seeded(1), group(),
                                                cpprun::FsdpOptions().stage(2).param_dtype(torch::kBFloat16));
  const std::string path = "/tmp/cpprun_state_dict_mp_" + std::to_string(::getppid()) + ".safetensors";
  CHECK_THROWS_WITH(cpprun::save_state_dict(model, path), Catch::Matchers::Contains("under mixed precision"));
  CHECK_THROWS_WITH(cpprun::load_state_dict(model, path), Catch::Matchers::Contains("under mixed precision"));
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
  if (rank == 0) {
    CHECK_THAT(message, Catch::Matchers::Contains("fc1.weight: file float32 [9, 8], module float32 [13, 8] "
                                                  "(in model-00001-of-00001.safetensors)"));
  }
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

// Run by tests/dist/hf_sharded_reshard.sh: CPPRUN_HF_PHASE=save (on 4 ranks) saves FSDP stage 3's
// seed-5 model into CPPRUN_HF_DIR, one file per rank; =load (on 1 to 3 ranks) loads it into a
// plain module, DDP and FSDP stage 3, each equal bit for bit to the seed-5 model.
TEST_CASE("state_dict: a Hugging Face sharded directory saved on 4 ranks loads at another world size",
          "[.hf_reshard]") {
  const char* phase = std::getenv("CPPRUN_HF_PHASE");
  const char* dir_env = std::getenv("CPPRUN_HF_DIR");
  REQUIRE(phase != nullptr);
  REQUIRE(dir_env != nullptr);
  const std::string dir = std::string(dir_env) + "/";
  const int rank = group().rank();
  if (std::string(phase) == "save") {
    REQUIRE(group().size() == 4);
    auto model = cpprun::FullyShardedDataParallel(seeded(5), group(),
                                                  cpprun::FsdpOptions().stage(3).wrap_policy(is_linear));
    cpprun::save_state_dict(model, dir, cpprun::StateDictSaveOptions().step(3));
    CHECK(checked_shard_files(dir, 3).size() == 4);
    return;
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
