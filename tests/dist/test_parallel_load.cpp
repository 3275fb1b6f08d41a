// A model's load from a sharded directory reads the files on every rank in parallel
// (checkpoint/parallel_load.h): a directory saved at any world size loads into DDP, FSDP and HSDP
// with the saved values; a damaged or missing file that another rank than 0 reads is refused on
// every rank, naming it, with that rank's error, and no tensor of any rank changed.
#include "catch.h"
#include <torch/torch.h>
#include <unistd.h>  // getppid

#include <filesystem>
#include <functional>
#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/sharded_state_dict.h"
#include "checkpoint/state_dict.h"
#include "cpprun/cpprun.h"
#include "dist_test_support.h"
#include "optimizer_state_check.h"
#include "support/safetensors_index.h"

namespace {

namespace fs = std::filesystem;
using dist_test::group;

// float64: Linear(8, 13) + BatchNorm1d(13) (buffers, an int64 among them) + Linear(13, 13) +
// Linear(13, 5): 13 and 5 rows, which 2, 3 and 4 ranks do not divide.
struct Layers : torch::nn::Module {
  Layers() {
    fc1 = register_module("fc1", torch::nn::Linear(8, 13));
    norm = register_module("norm", torch::nn::BatchNorm1d(13));
    fc2 = register_module("fc2", torch::nn::Linear(13, 13));
    fc3 = register_module("fc3", torch::nn::Linear(13, 5));
    to(torch::kDouble);
  }
  torch::Tensor forward(torch::Tensor x) { return fc3(torch::tanh(fc2(norm(fc1(x))))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
  torch::nn::BatchNorm1d norm{nullptr};
};

// Seeded weights and buffers: every tensor's values depend on `seed`.
std::shared_ptr<Layers> seeded_layers(int seed) {
  torch::manual_seed(seed);
  auto net = std::make_shared<Layers>();
  torch::NoGradGuard no_grad;
  for (auto& buffer : net->buffers()) {
    if (buffer.is_floating_point()) buffer.uniform_(0.5, 1.5);
  }
  net->norm->num_batches_tracked.fill_(seed);
  return net;
}

bool is_linear(const torch::nn::Module& m) { return m.as<torch::nn::Linear>() != nullptr; }

std::string scratch(const std::string& what) {
  return "/tmp/cpprun_parallel_load_" + what + "_" + std::to_string(::getppid()) + "/";
}

// The whole state of a wrapper, by name, on every rank (copies).
template <typename Model>
std::map<std::string, torch::Tensor> whole_state_of(Model& model) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& item : cpprun::get_model_state_dict(model)) out[item.key()] = item.value().clone();
  return out;
}

void check_equal_states(const std::map<std::string, torch::Tensor>& got,
                        const std::map<std::string, torch::Tensor>& expected) {
  REQUIRE(got.size() == expected.size());
  for (const auto& [name, tensor] : expected) {
    INFO(name);
    REQUIRE(got.count(name) == 1);
    CHECK(got.at(name).scalar_type() == tensor.scalar_type());
    CHECK(torch::equal(got.at(name), tensor));
  }
}

std::map<std::string, torch::Tensor> plain_state(torch::nn::Module& module) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& [name, tensor] : cpprun::detail::module_state(module)) out[name] = tensor.clone();
  return out;
}

// The wrappers a load goes into: DDP, FSDP at stages 1 and 3, and HSDP (2 x 2, on 4 ranks).
template <typename F>
void for_each_wrapper(int seed, F&& f) {
  {
    auto ddp = cpprun::DistributedDataParallel(seeded_layers(seed), group());
    f(ddp, "ddp");
  }
  for (const int stage : {1, 3}) {
    auto fsdp = cpprun::FullyShardedDataParallel(seeded_layers(seed), group(),
                                                 cpprun::FsdpOptions().stage(stage).wrap_policy(is_linear));
    f(fsdp, "zero" + std::to_string(stage));
  }
  if (group().size() == 4) {
    const cpprun::DeviceMesh mesh(group(), std::vector<int>{2, 2}, std::vector<std::string>{"replicate", "shard"});
    auto hsdp = cpprun::FullyShardedDataParallel(seeded_layers(seed), mesh,
                                                 cpprun::FsdpOptions().stage(3).wrap_policy(is_linear));
    f(hsdp, "hsdp");
  }
}

std::string error_of(const std::function<void()>& fn, std::string* kind = nullptr) {
  try {
    fn();
  } catch (const cpprun::CorruptCheckpointError& e) {
    if (kind) *kind = "corrupt";
    return e.what();
  } catch (const std::exception& e) {
    if (kind) *kind = "other";
    return e.what();
  }
  return "(nothing thrown)";
}

}  // namespace

TEST_CASE("state_dict: a directory saved at N ranks loads at another world size, each rank reading its files",
          "[state_dict]") {
  const int saved_at = GENERATE(1, 2, 3, 5);
  INFO("saved at " << saved_at << " ranks, loaded at " << group().size());
  const std::string dir = scratch("n" + std::to_string(saved_at));
  auto saved = seeded_layers(1);
  const auto expected = plain_state(*saved);
  // A save at `saved_at` ranks, played on rank 0: one file per writer, then the index.
  if (group().rank() == 0) {
    const cpprun::detail::NamedTensors state = cpprun::detail::module_state(*saved);
    fs::create_directories(dir);
    const cpprun::detail::ShardedSaveStamp stamp{"0123456789abcdef0123456789abcdef", 7, {}};
    for (int r = 0; r < saved_at; ++r) cpprun::detail::write_state_dict_shard(state, dir, r, saved_at, stamp);
    cpprun::detail::write_state_dict_index(state, dir, saved_at, stamp);
  }
  cpprun::barrier(group());
  for_each_wrapper(2, [&](auto& model, const std::string& kind) {
    INFO(kind);
    const auto report = cpprun::load_state_dict(model, dir);
    CHECK(report.missing_keys.empty());
    CHECK(report.unexpected_keys.empty());
    CHECK(report.mismatched.empty());
    check_equal_states(whole_state_of(model), expected);
  });
  cpprun::barrier(group());
  if (group().rank() == 0) fs::remove_all(dir);
}

TEST_CASE("state_dict: a directory's damaged or missing file read by another rank is refused on every rank",
          "[state_dict]") {
  const int rank = group().rank(), world = group().size();
  const std::string dir = scratch("faults");
  {
    auto ddp = cpprun::DistributedDataParallel(seeded_layers(1), group());
    cpprun::save_state_dict(ddp, dir);
  }
  const int files = std::min(world, 11);  // Layers has 11 tensors: a file per rank
  // File 2 is read by rank 1 (file i by rank i mod world); alone, file 1 by rank 0.
  const int victim_file = files >= 2 ? 2 : 1, reader = victim_file - 1;
  const std::string victim = cpprun::detail::shard_file_name(victim_file, files);
  const std::string kept = scratch("kept") + victim;
  if (rank == 0) {
    fs::create_directories(scratch("kept"));
    fs::copy_file(dir + victim, kept, fs::copy_options::overwrite_existing);
  }
  for (const std::string fault : {"damaged", "missing"}) {
    INFO(fault);
    cpprun::barrier(group());
    if (rank == 0) {
      if (fault == "damaged") {  // one byte of the last tensor's data flipped: its CRC no longer matches
        std::fstream f(dir + victim, std::ios::in | std::ios::out | std::ios::binary);
        f.seekg(-3, std::ios::end);
        const char c = static_cast<char>(f.get());
        f.seekp(-3, std::ios::end);
        f.put(static_cast<char>(c ^ 0x40));
      } else {
        fs::remove(dir + victim);
      }
    }
    cpprun::barrier(group());
    for_each_wrapper(3, [&](auto& model, const std::string& kind) {
      INFO(kind);
      const auto before = whole_state_of(model);
      std::string type;
      const std::string message = error_of([&] { cpprun::load_state_dict(model, dir); }, &type);
      CHECK(type == "corrupt");
      CHECK_THAT(message, Catch::Matchers::Contains(victim));
      if (fault == "damaged") {
        CHECK_THAT(message, Catch::Matchers::Contains("is damaged"));
        // The reader raises its own error; the others the same, saying whose it is.
        if (rank == reader) {
          CHECK_THAT(message, !Catch::Matchers::Contains("(raised on rank"));
        } else {
          CHECK_THAT(message, Catch::Matchers::Contains("(raised on rank " + std::to_string(reader) + ")"));
        }
      } else {
        CHECK_THAT(message, Catch::Matchers::Contains("lacks"));
      }
      check_equal_states(whole_state_of(model), before);
      CHECK(!torch::equal(before.at("fc1.weight"), plain_state(*seeded_layers(1)).at("fc1.weight")));
    });
    cpprun::barrier(group());
    if (rank == 0) fs::copy_file(kept, dir + victim, fs::copy_options::overwrite_existing);
  }
  // Whole again: it loads.
  cpprun::barrier(group());
  for_each_wrapper(3, [&](auto& model, const std::string& kind) {
    INFO(kind);
    cpprun::load_state_dict(model, dir);
    check_equal_states(whole_state_of(model), plain_state(*seeded_layers(1)));
  });
  cpprun::barrier(group());
  if (rank == 0) {
    fs::remove_all(dir);
    fs::remove_all(scratch("kept"));
  }
}

TEST_CASE("state_dict: a parallel directory load keeps strict(false)'s report and the prefix options",
          "[state_dict]") {
  const int rank = group().rank();
  const std::string dir = scratch("options");
  // The file's names under "module." (as torch.save(ddp.state_dict())), one tensor missing, one of
  // another shape, saved at 2 ranks.
  if (rank == 0) {
    cpprun::detail::NamedTensors state;
    for (const auto& [name, tensor] : cpprun::detail::module_state(*seeded_layers(1))) {
      if (name == "fc2.bias") continue;
      state.emplace_back("module." + name, name == "fc3.bias" ? torch::zeros({7}, torch::kDouble) : tensor);
    }
    fs::create_directories(dir);
    const cpprun::detail::ShardedSaveStamp stamp{"00112233445566778899aabbccddeeff", std::nullopt, {}};
    for (int r = 0; r < 2; ++r) cpprun::detail::write_state_dict_shard(state, dir, r, 2, stamp);
    cpprun::detail::write_state_dict_index(state, dir, 2, stamp);
  }
  cpprun::barrier(group());
  for_each_wrapper(2, [&](auto& model, const std::string& kind) {
    INFO(kind);
    const auto before = whole_state_of(model);
    // Strict: refused on every rank alike, each difference named with its file, nothing changed.
    const std::string message = error_of([&] {
      cpprun::load_state_dict(model, dir, cpprun::StateDictOptions().consume_prefix_in_state_dict_if_present("module."));
    });
    CHECK_THAT(message, Catch::Matchers::Contains("missing from the index and its files (1): fc2.bias"));
    CHECK_THAT(message, Catch::Matchers::Contains("fc3.bias: file float64 [7], module float64 [5]"));
    CHECK_THAT(message, !Catch::Matchers::Contains("raised on rank"));
    check_equal_states(whole_state_of(model), before);
    // strict(false): what fits loads; the report is every rank's.
    const auto report = cpprun::load_state_dict(
        model, dir,
        cpprun::StateDictOptions().strict(false).consume_prefix_in_state_dict_if_present("module."));
    CHECK(report.missing_keys == std::vector<std::string>{"fc2.bias"});
    REQUIRE(report.mismatched.size() == 1);
    CHECK_THAT(report.mismatched[0], Catch::Matchers::StartsWith("fc3.bias"));
    const auto after = whole_state_of(model);
    const auto saved = plain_state(*seeded_layers(1));
    for (const auto& [name, tensor] : after) {
      INFO(name);
      CHECK(torch::equal(tensor, name == "fc2.bias" || name == "fc3.bias" ? before.at(name) : saved.at(name)));
    }
  });
  cpprun::barrier(group());
  if (rank == 0) fs::remove_all(dir);
}

namespace {

// A tied weight (an LM's embedding and head), and an untied twin whose two tensors differ.
struct TiedPair : torch::nn::Module {
  torch::Tensor shared = register_parameter("embed", torch::randn({3, 2}, torch::kDouble));
  TiedPair() { register_parameter("head", shared); }
};
struct UntiedPair : torch::nn::Module {
  torch::Tensor embed = register_parameter("embed", torch::randn({3, 2}, torch::kDouble));
  torch::Tensor head = register_parameter("head", torch::randn({3, 2}, torch::kDouble));
};

}  // namespace

TEST_CASE("state_dict: a parallel directory load refuses tied names whose files differ, read by two ranks",
          "[state_dict]") {
  const int rank = group().rank();
  const std::string untied = scratch("untied"), tied = scratch("tied");
  torch::manual_seed(5);
  const auto twin = std::make_shared<UntiedPair>();
  const auto same = std::make_shared<TiedPair>();
  // Saved at 2 ranks: "embed" in the first file and "head" in the second, read by ranks 0 and 1.
  if (rank == 0) {
    for (const auto& [dir, module] : {std::pair<std::string, torch::nn::Module*>{untied, twin.get()},
                                      std::pair<std::string, torch::nn::Module*>{tied, same.get()}}) {
      const cpprun::detail::NamedTensors state = cpprun::detail::module_state(*module);
      fs::create_directories(dir);
      const cpprun::detail::ShardedSaveStamp stamp{"ffeeddccbbaa99887766554433221100", std::nullopt, {}};
      for (int r = 0; r < 2; ++r) cpprun::detail::write_state_dict_shard(state, dir, r, 2, stamp);
      cpprun::detail::write_state_dict_index(state, dir, 2, stamp);
    }
  }
  cpprun::barrier(group());
  torch::manual_seed(6);
  auto model = cpprun::DistributedDataParallel(std::make_shared<TiedPair>(), group());
  const torch::Tensor before = model->module()->named_parameters()["embed"].clone();
  const std::string message = error_of([&] { cpprun::load_state_dict(model, untied); });
  CHECK_THAT(message, Catch::Matchers::Contains("\"embed\" and \"head\"") && Catch::Matchers::Contains("ties them"));
  CHECK(torch::equal(model->module()->named_parameters()["embed"], before));
  // Equal copies (what a tied module saves) load.
  cpprun::load_state_dict(model, tied);
  CHECK(torch::equal(model->module()->named_parameters()["embed"], same->shared));
  cpprun::barrier(group());
  if (rank == 0) {
    fs::remove_all(untied);
    fs::remove_all(tied);
  }
}

TEST_CASE("state_dict: an optimizer's directory is read on every rank; a damaged file is its reader's error",
          "[state_dict]") {
  const int rank = group().rank(), world = group().size();
  const std::string dir = scratch("optimizer");
  auto step = [](auto& model, torch::optim::Optimizer& optimizer) {
    torch::manual_seed(11 + group().rank());
    optimizer.zero_grad();
    model->forward(torch::randn({4, 8}, torch::kDouble)).pow(2).sum().backward();
    optimizer.step();
  };
  auto saved = cpprun::FullyShardedDataParallel(seeded_layers(1), group(),
                                                cpprun::FsdpOptions().stage(3).wrap_policy(is_linear));
  torch::optim::Adam saved_adam(saved->parameters(), 1e-2);
  step(saved, saved_adam);
  cpprun::save_state_dict(saved, saved_adam, dir);
  const auto expected = cpprun::get_optimizer_state_dict(saved, saved_adam);
  const int files = std::min(world, 24);  // 8 parameters' exp_avg, exp_avg_sq and step: a file per rank
  const int victim_file = files >= 2 ? 2 : 1, reader = victim_file - 1;
  const std::string victim = cpprun::detail::shard_file_name(victim_file, files, cpprun::detail::kOptimizerStem);
  const std::string kept = scratch("optimizer_kept") + victim;
  if (rank == 0) {
    fs::create_directories(scratch("optimizer_kept"));
    fs::copy_file(dir + victim, kept, fs::copy_options::overwrite_existing);
    std::fstream f(dir + victim, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-3, std::ios::end);
    const char c = static_cast<char>(f.get());
    f.seekp(-3, std::ios::end);
    f.put(static_cast<char>(c ^ 0x40));
  }
  cpprun::barrier(group());
  // Loaded at this world size into DDP: the state of every parameter, whole.
  auto model = cpprun::DistributedDataParallel(seeded_layers(1), group());
  torch::optim::Adam adam(model->parameters(), 1e-3);
  std::string type;
  const std::string message = error_of([&] { cpprun::load_optimizer_state_dict(model, adam, dir); }, &type);
  CHECK(type == "corrupt");
  CHECK_THAT(message, Catch::Matchers::Contains(victim) && Catch::Matchers::Contains("is damaged"));
  if (rank == reader) {
    CHECK_THAT(message, !Catch::Matchers::Contains("(raised on rank"));
  } else {
    CHECK_THAT(message, Catch::Matchers::Contains("(raised on rank " + std::to_string(reader) + ")"));
  }
  CHECK(adam.state().empty());  // no parameter's state was loaded, not even those read before the damaged file
  cpprun::barrier(group());
  if (rank == 0) fs::copy_file(kept, dir + victim, fs::copy_options::overwrite_existing);
  cpprun::barrier(group());
  // Loaded into each wrapper: every parameter's state, whole (each FSDP and HSDP rank reading only
  // its own rows from the files, DDP's ranks all of it).
  for_each_wrapper(2, [&](auto& loading, const std::string& kind) {
    INFO(kind);
    torch::optim::Adam loading_adam(loading->parameters(), 1e-3);
    cpprun::load_optimizer_state_dict(loading, loading_adam, dir);
    dist_test::check_same_optimizer_state(cpprun::get_optimizer_state_dict(loading, loading_adam), expected);
  });
  cpprun::barrier(group());
  if (rank == 0) {
    fs::remove_all(dir);
    fs::remove_all(scratch("optimizer_kept"));
  }
}
