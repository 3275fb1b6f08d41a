// Asynchronous saves (cpprun::save_async): training goes on while the file is written, and the
// file is, byte for byte, what a synchronous save at that step writes; a failed save raises its
// error on wait() (on every rank) and, when nobody waited, on the next save; back-to-back saves
// follow each other. A plain module, DDP, FSDP stage 3, files and Hugging Face sharded directories;
// a model and its Adam optimizer as one save (save_async(model, optimizer, ...)), the same.
#include "catch.h"
#include <torch/torch.h>
#include <unistd.h>  // getppid

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <tuple>
#include <vector>
#include <string>

#include "cpprun/cpprun.h"
#include "dist_test_support.h"

namespace {

using dist_test::group;
namespace fs = std::filesystem;

struct Net : torch::nn::Module {
  Net() {
    fc1 = register_module("fc1", torch::nn::Linear(8, 32));
    fc2 = register_module("fc2", torch::nn::Linear(32, 4));
    scale = register_buffer("scale", torch::rand({4}));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::relu(fc1(x))) * scale; }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::Tensor scale;
};

bool is_linear(const torch::nn::Module& m) { return m.as<torch::nn::Linear>() != nullptr; }

std::shared_ptr<Net> seeded(int seed) {
  torch::manual_seed(seed);
  return std::make_shared<Net>();
}

std::string bytes_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// `steps` SGD steps of `model` on this rank's random batches: the parameters change in place.
template <typename Model>
void train(Model& model, torch::optim::Optimizer& opt, int steps) {
  for (int i = 0; i < steps; ++i) {
    opt.zero_grad();
    const auto x = torch::randn({4, 8});
    model->forward(x).square().sum().backward();
    opt.step();
  }
}

// Every tensor of the state dict at A equals B's, bit for bit (a directory's files carry
// different save ids, so the bytes differ; the tensors may not).
void check_same_tensors(const std::string& a, const std::string& b) {
  auto left = seeded(100), right = seeded(101);
  cpprun::load_state_dict(left, a);
  cpprun::load_state_dict(right, b);
  for (const auto& item : left->named_parameters()) CHECK(torch::equal(item.value(), right->named_parameters()[item.key()]));
  CHECK(torch::equal(left->scale, right->scale));
}

std::string base(const std::string& kind) {
  return "/tmp/cpprun_async_" + kind + "_" + std::to_string(::getppid());
}

// A save at step 1 while training goes on: the same bytes as a synchronous save at step 1, and
// not the model's state after the steps that followed. `rank_writes`: whether this rank checks files.
template <typename Model>
void check_save_while_training(Model& model, torch::optim::Optimizer& opt, const std::string& prefix,
                               bool rank_writes) {
  for (const std::string suffix : {".pt", ".safetensors", "_hf/"}) {
    INFO(prefix << suffix);
    const std::string sync = prefix + "_sync" + suffix, async = prefix + "_async" + suffix,
                      later = prefix + "_later" + suffix;
    const auto options = cpprun::StateDictSaveOptions().step(1);
    cpprun::save_state_dict(model, sync, options);
    cpprun::AsyncSave pending = cpprun::save_async(model, async, options);
    CHECK(pending.path() == async);
    train(model, opt, 3);  // collectives of training on this thread while the save is written
    pending.wait();
    CHECK(pending.done());
    cpprun::save_state_dict(model, later, options);
    if (rank_writes) {
      if (suffix.back() == '/') {
        check_same_tensors(sync, async);
        CHECK(fs::exists(fs::path(async) / "model.safetensors.index.json"));
      } else {
        const std::string written = bytes_of(async);
        CHECK(!written.empty());
        CHECK(written == bytes_of(sync));
        CHECK(written != bytes_of(later));  // the training steps changed the model after the copy
      }
    }
  }
}

// A save that cannot be written (its directory is a regular file): wait() raises the error on
// every rank, each time; unwaited, the next save raises it and does not start; after that,
// saving works again.
template <typename Model>
void check_errors(Model& model, const std::string& prefix, bool collective) {
  const int rank = group().rank();
  const std::string blocker = prefix + "_blocker";
  if (rank == 0 || !collective) std::ofstream(blocker) << "a file, not a directory";
  if (collective) cpprun::barrier(group());
  const std::string good = prefix + "_good.safetensors";
  for (const std::string& bad : {blocker + "/model.pt", blocker + "/hf/"}) {
    INFO(bad);
    cpprun::AsyncSave failed = cpprun::save_async(model, bad);
    CHECK_THROWS_WITH(failed.wait(), Catch::Matchers::Contains(blocker));
    CHECK(failed.done());
    CHECK_THROWS_WITH(failed.wait(), Catch::Matchers::Contains(blocker));  // again: it stays
    cpprun::save_async(model, good).wait();  // the error was seen: this save goes ahead

    // Nobody waits: the next save raises it, before it starts.
    cpprun::AsyncSave unwaited = cpprun::save_async(model, bad);
    fs::remove(good);
    CHECK_THROWS_WITH(cpprun::save_async(model, good),
                      Catch::Matchers::Contains("previous asynchronous save") && Catch::Matchers::Contains(blocker));
    CHECK(!fs::exists(good));
    CHECK_THROWS_WITH(unwaited.wait(), Catch::Matchers::Contains(blocker));  // still there for wait()
    cpprun::save_async(model, good).wait();
    CHECK(fs::exists(good));

    // A handle dropped unwaited: the destructor waits (and logs); the next save, a synchronous
    // one here, raises it.
    { cpprun::AsyncSave dropped = cpprun::save_async(model, bad); }
    CHECK_THROWS_WITH(cpprun::save_state_dict(model, good), Catch::Matchers::Contains("previous asynchronous save"));
    cpprun::save_state_dict(model, good);
  }
  if (collective) cpprun::barrier(group());
  if (rank == 0 || !collective) fs::remove(blocker);
}

// Two saves back to back: the second waits for the first; each holds the state at its own call.
template <typename Model>
void check_back_to_back(Model& model, torch::optim::Optimizer& opt, const std::string& prefix, bool rank_writes) {
  const std::string one = prefix + "_one.safetensors", two = prefix + "_two.safetensors";
  const std::string sync_one = prefix + "_sync_one.safetensors", sync_two = prefix + "_sync_two.safetensors";
  cpprun::save_state_dict(model, sync_one);
  cpprun::AsyncSave first = cpprun::save_async(model, one);
  cpprun::AsyncSave second = cpprun::save_async(model, two);
  CHECK(first.done());  // the second save waited for it
  train(model, opt, 2);
  second.wait();
  cpprun::save_state_dict(model, sync_two);
  cpprun::AsyncSave third = cpprun::save_async(model, one);  // over the first file
  train(model, opt, 2);
  third.wait();
  if (rank_writes) {
    CHECK(bytes_of(one) == bytes_of(sync_two));
    CHECK(bytes_of(two) == bytes_of(sync_one));
  }
}

// The files under PATH (a file: itself), by name relative to it.
std::map<std::string, std::string> files_under(const std::string& path) {
  std::map<std::string, std::string> out;
  if (!fs::is_directory(path)) {
    out[""] = bytes_of(path);
    return out;
  }
  for (const auto& entry : fs::directory_iterator(path)) out[entry.path().filename().string()] = bytes_of(entry.path());
  return out;
}

// The "cpprun_save_id" a .safetensors file or a directory's index records.
std::string save_id_in(const std::string& path) {
  const std::string bytes = bytes_of(path);
  const std::string key = "\"cpprun_save_id\":";
  const std::size_t at = bytes.find(key);
  if (at == std::string::npos) return "";
  const std::size_t open = bytes.find('"', at + key.size()), close = bytes.find('"', open + 1);
  return bytes.substr(open + 1, close - open - 1);
}

// A model and its optimizer saved as one asynchronous save while training goes on: the files
// are byte for byte those of the synchronous saves at that step (same save id and step), not
// the state after the steps that followed (the optimizer's state changes in place); saved
// without a save id, every file of the save records one and the same.
template <typename Model>
void check_optimizer_save_while_training(Model& model, torch::optim::Optimizer& opt, const std::string& prefix,
                                         bool rank_writes) {
  train(model, opt, 1);  // the optimizer has state
  for (const bool directory : {false, true}) {
    INFO(prefix << (directory ? " to a directory" : " to files"));
    const auto name = [&](const std::string& which) {
      return directory ? std::make_pair(prefix + "_opt_" + which + "/", prefix + "_opt_" + which + "/")
                       : std::make_pair(prefix + "_opt_" + which + "_model.safetensors",
                                        prefix + "_opt_" + which + "_optimizer.safetensors");
    };
    const auto [sync_model, sync_opt] = name("sync");
    const auto [async_model, async_opt] = name("async");
    const auto [later_model, later_opt] = name("later");
    const auto options = cpprun::StateDictSaveOptions().step(7).save_id(cpprun::new_save_id());
    cpprun::save_state_dict(model, sync_model, options);
    cpprun::save_optimizer_state_dict(model, opt, sync_opt, options);
    cpprun::AsyncSave pending = cpprun::save_async(model, opt, async_model, async_opt, options);
    train(model, opt, 3);  // steps the optimizer: its exp_avg tensors change in place
    pending.wait();
    cpprun::save_state_dict(model, later_model, options);
    cpprun::save_optimizer_state_dict(model, opt, later_opt, options);
    if (rank_writes) {
      std::vector<std::tuple<std::string, std::string, std::string>> compared{{sync_model, async_model, later_model}};
      if (!directory) compared.emplace_back(sync_opt, async_opt, later_opt);  // a directory holds both
      for (const auto& [sync, async, later] : compared) {
        const auto written = files_under(async), expected = files_under(sync), after = files_under(later);
        CHECK(written.size() == expected.size());
        CHECK(written == expected);
        CHECK(written != after);
      }
      if (directory) {
        CHECK(fs::exists(async_model + "model.safetensors.index.json"));
        CHECK(fs::exists(async_opt + "optimizer.safetensors.index.json"));
      }
    }
    // No save id given: one drawn, in the model's files and the optimizer's alike.
    cpprun::save_async(model, opt, async_model, async_opt, cpprun::StateDictSaveOptions().step(8)).wait();
    if (rank_writes) {
      const std::string model_file = directory ? async_model + "model.safetensors.index.json" : async_model;
      const std::string opt_file = directory ? async_opt + "optimizer.safetensors.index.json" : async_opt;
      CHECK(save_id_in(model_file).size() == 32);
      CHECK(save_id_in(model_file) == save_id_in(opt_file));
      CHECK(save_id_in(model_file) != *options.save_id());
    }
  }
}

// A model-and-optimizer save that cannot be written: wait() raises it on every rank; unwaited,
// the next save raises it; a model path that is the optimizer's file is refused at the call.
template <typename Model>
void check_optimizer_errors(Model& model, torch::optim::Optimizer& opt, const std::string& prefix, bool collective) {
  const int rank = group().rank();
  const std::string blocker = prefix + "_opt_blocker";
  if (rank == 0 || !collective) std::ofstream(blocker) << "a file, not a directory";
  if (collective) cpprun::barrier(group());
  const std::string good = prefix + "_opt_good/";
  for (const std::string& bad : {blocker + "/optimizer.safetensors", blocker + "/hf/"}) {
    INFO(bad);
    cpprun::AsyncSave failed = cpprun::save_async(model, opt, good, bad);
    CHECK_THROWS_WITH(failed.wait(), Catch::Matchers::Contains(blocker));
    CHECK(failed.done());
    cpprun::AsyncSave unwaited = cpprun::save_async(model, opt, good, bad);
    CHECK_THROWS_WITH(cpprun::save_async(model, opt, good, good),
                      Catch::Matchers::Contains("previous asynchronous save") && Catch::Matchers::Contains(blocker));
    CHECK_THROWS_WITH(unwaited.wait(), Catch::Matchers::Contains(blocker));
    cpprun::save_async(model, opt, good, good).wait();  // seen: this one goes ahead
  }
  const std::string same = prefix + "_opt_same.safetensors";
  CHECK_THROWS_WITH(cpprun::save_async(model, opt, same, same), Catch::Matchers::Contains("would be one file"));
  CHECK_THROWS_WITH(cpprun::save_async(model, opt, good, prefix + "_opt.pt"),
                    Catch::Matchers::Contains("end the path in .safetensors"));
  if (collective) cpprun::barrier(group());
  if (rank == 0 || !collective) fs::remove(blocker);
}

void clean(const std::string& prefix, bool collective) {
  if (collective) cpprun::barrier(group());
  if (collective && group().rank() != 0) return;
  const fs::path parent = fs::path(prefix).parent_path();
  const std::string stem = fs::path(prefix).filename().string();
  for (const auto& entry : fs::directory_iterator(parent)) {
    if (entry.path().filename().string().rfind(stem, 0) == 0) fs::remove_all(entry.path());
  }
}

}  // namespace

TEST_CASE("async_save: a plain module, this process alone", "[async_save]") {
  auto net = seeded(1);
  torch::optim::SGD opt(net->parameters(), 0.05);
  const std::string prefix = base("module_r" + std::to_string(group().rank()));
  check_save_while_training(net, opt, prefix, true);
  check_errors(net, prefix, false);
  check_back_to_back(net, opt, prefix, true);
  torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(0.01));
  check_optimizer_save_while_training(net, adam, prefix, true);
  check_optimizer_errors(net, adam, prefix, false);
  clean(prefix, false);
}

TEST_CASE("async_save: DDP, collective, written while training goes on", "[async_save]") {
  auto model = cpprun::DistributedDataParallel(seeded(1), group());
  torch::optim::SGD opt(model->parameters(), 0.05);
  const std::string prefix = base("ddp");
  check_save_while_training(model, opt, prefix, true);
  check_errors(model, prefix, true);
  check_back_to_back(model, opt, prefix, group().rank() == 0);
  torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(0.01));
  check_optimizer_save_while_training(model, adam, prefix, group().rank() == 0);
  check_optimizer_errors(model, adam, prefix, true);
  clean(prefix, true);
}

TEST_CASE("async_save: FSDP stage 3, copied on the calling thread, written in the background", "[async_save]") {
  auto model = cpprun::FullyShardedDataParallel(seeded(1), group(),
                                                cpprun::FsdpOptions().stage(3).wrap_policy(is_linear));
  torch::optim::SGD opt(model->parameters(), 0.05);
  const std::string prefix = base("fsdp3");
  check_save_while_training(model, opt, prefix, true);
  check_errors(model, prefix, true);
  check_back_to_back(model, opt, prefix, group().rank() == 0);
  torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(0.01));
  check_optimizer_save_while_training(model, adam, prefix, group().rank() == 0);
  check_optimizer_errors(model, adam, prefix, true);
  clean(prefix, true);
}
