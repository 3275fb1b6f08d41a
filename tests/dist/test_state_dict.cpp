// State dicts through DDP and FSDP (cpprun/state_dict.h): what a wrapper saves is what the plain
// module holds; what a wrapper loads is what the plain module would, on every rank, and the
// sharded model computes with it; a file of other shapes is refused on every rank.
#include <catch2/catch.hpp>
#include <torch/torch.h>
#include <unistd.h>  // getppid

#include <cstdio>
#include <string>

#include "cpprun/cpprun.h"
#include "dist_test_support.h"

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
