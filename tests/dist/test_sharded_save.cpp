// A sharded directory saved by FSDP (every stage, HSDP): each rank writes its own rows into the
// files (checkpoint/rows_in_place.h): the files are byte for byte those DDP's whole tensors make,
// the optimizer's hold what its single file (gathered everywhere) holds, no rank holds a whole
// tensor during the save, and a save that fails on any rank (a directory not shared, a file that
// cannot be put in place) fails on every rank and leaves nothing. save_async (model; model and
// optimizer) does the same from its background thread, each rank's rows copied during the call
// (Note [An asynchronous save in place] in checkpoint/async_save.cpp), and its files are the
// synchronous save's even when training changes every tensor as soon as the call returns.
#include "catch.h"
#include <torch/torch.h>
#include <unistd.h>  // getppid

#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include "checkpoint/sharded_state_dict.h"
#include "checkpoint/state_dict.h"
#include "cpprun/cpprun.h"
#include "counting_allocator.h"
#include "dist_test_support.h"
#include "optimizer_state_check.h"
#include "support/safetensors_index.h"

namespace {

namespace fs = std::filesystem;
using dist_test::counting_allocator;
using dist_test::CountingAllocator;
using dist_test::group;

// Six Linears without bias (float64) of `width` outputs: 13 or 101 rows, which divide by none of
// 2, 3 and 4 ranks.
struct Tower : torch::nn::Module {
  explicit Tower(int64_t width) {
    for (int i = 0; i < 6; ++i) {
      layers.push_back(register_module("fc" + std::to_string(i),
                                       torch::nn::Linear(torch::nn::LinearOptions(i ? width : 8, width).bias(false))));
    }
    to(torch::kDouble);
  }
  torch::Tensor forward(torch::Tensor x) {
    for (auto& l : layers) x = torch::tanh(l(x));
    return x;
  }
  std::vector<torch::nn::Linear> layers;
};

// Tensors larger than the files' 64 KiB blocks, of rows that leave ranks with none (fc1: 2 rows),
// BatchNorm's buffers (one an int64) between them, and a bf16 layer.
struct Mixed : torch::nn::Module {
  Mixed() {
    fc0 = register_module("fc0", torch::nn::Linear(8, 4099));
    bn = register_module("bn", torch::nn::BatchNorm1d(4099));
    fc1 = register_module("fc1", torch::nn::Linear(4099, 2));
    fc2 = register_module("fc2", torch::nn::Linear(2, 3));
    to(torch::kDouble);
    fc2->to(torch::kBFloat16);
  }
  torch::Tensor forward(torch::Tensor x) {
    x = fc1(torch::tanh(bn(fc0(x))));
    return fc2(x.to(torch::kBFloat16)).to(torch::kDouble);
  }
  torch::nn::Linear fc0{nullptr}, fc1{nullptr}, fc2{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
};

std::shared_ptr<Tower> seeded_tower(int seed, int64_t width = 13) {
  torch::manual_seed(seed);
  return std::make_shared<Tower>(width);
}

bool is_linear(const torch::nn::Module& m) { return m.as<torch::nn::Linear>() != nullptr; }

std::string file_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The names of what directory `dir` holds.
std::set<std::string> names_in(const fs::path& dir) {
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
  return names;
}

// Every file of directory `a` has the same bytes in `b`, and they hold the same files.
void check_same_files(const fs::path& a, const fs::path& b) {
  const std::set<std::string> in_a = names_in(a), in_b = names_in(b);
  CHECK(in_a == in_b);
  for (const auto& name : in_a) {
    INFO(name);
    CHECK(file_bytes(a / name) == file_bytes(b / name));
  }
}

// The same tensors (names, dtypes, values) in `a` and `b`.
void check_same_tensors(const cpprun::detail::NamedTensors& a, const cpprun::detail::NamedTensors& b) {
  std::map<std::string, torch::Tensor> by_name(b.begin(), b.end());
  REQUIRE(a.size() == b.size());
  for (const auto& [name, tensor] : a) {
    INFO(name);
    REQUIRE(by_name.count(name) == 1);
    CHECK(tensor.scalar_type() == by_name[name].scalar_type());
    CHECK(torch::equal(tensor, by_name[name]));
  }
}

// One step of Adam on a seeded batch: the optimizer then holds state to save.
template <typename Model>
void step_once(Model& model, torch::optim::Optimizer& optimizer) {
  torch::manual_seed(9 + group().rank());
  optimizer.zero_grad();
  model->forward(torch::randn({4, 8}, torch::kDouble)).pow(2).sum().backward();
  optimizer.step();
}

// What a call throws, as text ("(no error)" when it returns).
std::string error_text_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

std::string scratch(const std::string& what) {
  return "/tmp/cpprun_sharded_save_" + what + "_" + std::to_string(::getppid()) + "/";
}

}  // namespace

TEST_CASE("state_dict: FSDP's sharded save writes the bytes DDP's does, each rank writing its own rows",
          "[state_dict]") {
  const int stage = GENERATE(1, 2, 3, 4);  // 4: HSDP (2 replicas x 2 shards), on 4 ranks only
  if (stage == 4 && group().size() != 4) return;
  // The tower's tensors are each smaller than a block of the files (Note [One writer a block]); the
  // mixed net's are larger, of 2 rows (ranks with none), with buffers and a bf16 layer.
  const std::string net = GENERATE("tower", "mixed");
  INFO("stage " << stage << ", " << net);
  const std::string ddp_dir = scratch("ddp"), fsdp_dir = scratch("fsdp");
  const auto options = cpprun::StateDictSaveOptions().step(3).save_id("0123456789abcdef0123456789abcdef");
  const auto fsdp_options = cpprun::FsdpOptions().stage(stage == 4 ? 3 : stage).wrap_policy(is_linear);
  auto save_both = [&](auto make) {
    auto ddp = cpprun::DistributedDataParallel(make(), group());
    cpprun::save_state_dict(ddp, ddp_dir, options);
    auto save_fsdp = [&](auto& fsdp) {
      cpprun::save_state_dict(fsdp, fsdp_dir, options);
      cpprun::barrier(group());
      check_same_files(ddp_dir, fsdp_dir);

      // The optimizer's directory holds what its single file holds (every tensor gathered everywhere).
      torch::optim::Adam adam(fsdp->parameters(), 1e-2);
      step_once(fsdp, adam);
      cpprun::save_optimizer_state_dict(fsdp, adam, fsdp_dir, options);
      cpprun::save_optimizer_state_dict(fsdp, adam, fsdp_dir + "optimizer.safetensors", options);
      check_same_tensors(cpprun::detail::read_sharded_directory(fsdp_dir, cpprun::detail::kOptimizerStem).tensors,
                         cpprun::detail::read_state_dict_file(fsdp_dir + "optimizer.safetensors"));
      cpprun::barrier(group());
      if (group().rank() == 0) fs::remove_all(fsdp_dir);
    };
    if (stage == 4) {
      const cpprun::DeviceMesh mesh(group(), std::vector<int>{2, 2}, std::vector<std::string>{"replicate", "shard"});
      auto hsdp = cpprun::FullyShardedDataParallel(make(), mesh, fsdp_options);
      save_fsdp(hsdp);
    } else {
      auto fsdp = cpprun::FullyShardedDataParallel(make(), group(), fsdp_options);
      save_fsdp(fsdp);
    }
  };
  if (net == "tower") {
    save_both([] { return seeded_tower(1); });
  } else {
    save_both([] {
      torch::manual_seed(1);
      return std::make_shared<Mixed>();
    });
  }
  cpprun::barrier(group());
  if (group().rank() == 0) fs::remove_all(ddp_dir);
}

// What a rank of a save of DIR's STEM files may hold: its own file's tensors, a tensor being
// gathered (Gloo's buffer on the root) and its rows of one (the chunk it sends); and the whole.
struct Bounds {
  int64_t own = 0, largest = 0, all = 0;
};
Bounds bounds_of(const std::string& dir, std::string_view stem, int rank) {
  const auto read = cpprun::detail::read_sharded_directory(dir, stem);
  std::set<std::string> files;
  for (const auto& [name, file] : read.file_of) files.insert(file);
  const std::string mine = cpprun::detail::shard_file_name(rank + 1, static_cast<int>(files.size()), stem);
  Bounds b;
  for (const auto& [name, t] : read.tensors) {
    if (read.file_of.at(name) == mine) b.own += t.nbytes();
    b.largest = std::max<int64_t>(b.largest, t.nbytes());
    b.all += t.nbytes();
  }
  return b;
}

// The file of DIR's STEM files (the model's by default) that writer `writer` of its save wrote.
std::string shard_file_name_of(const std::string& dir, int writer, std::string_view stem = cpprun::detail::kModelStem) {
  std::set<std::string> files;
  for (const auto& [name, file] : cpprun::detail::read_sharded_directory(dir, stem).file_of) files.insert(file);
  return cpprun::detail::shard_file_name(writer + 1, static_cast<int>(files.size()), stem);
}

// See Note [Counting the save's tensor memory]. Each rank writes its own rows into the files
// (Note [Each rank writes its own rows] in checkpoint/rows_in_place.cpp): no rank holds a whole
// tensor, not even of its own file (the save made before 2026-12-06 gathered its own file's
// tensors, and before that, the whole model on every rank). What it holds are the blocks its rows
// share with others' in a file (Note [One writer a block]): at most 64 KiB at each end of a part,
// sent to the file's writer; the tensors here (8 MB) are much larger than that.
TEST_CASE("state_dict: a ZeRO-3 sharded save holds no tensor beyond the shards: each rank writes its own rows",
          "[state_dict]") {
  const int rank = group().rank(), world = group().size();
  CountingAllocator& counting = counting_allocator();
  auto model =
      cpprun::FullyShardedDataParallel(seeded_tower(1, 1024), group(), cpprun::FsdpOptions().stage(3).wrap_policy(is_linear));
  torch::optim::Adam adam(model->parameters(), 1e-2);
  step_once(model, adam);
  const std::string dir = scratch("memory");
  for (const std::string_view stem : {cpprun::detail::kModelStem, cpprun::detail::kOptimizerStem}) {
    cpprun::barrier(group());
    const int64_t before = counting.start();
    if (stem == cpprun::detail::kModelStem) {
      cpprun::save_state_dict(model, dir);
    } else {
      cpprun::save_optimizer_state_dict(model, adam, dir);
    }
    const int64_t extra = counting.peak - before;
    const Bounds b = bounds_of(dir, stem, rank);
    INFO(stem << " on rank " << rank << " of " << world << ": the save's peak extra tensor bytes " << extra
              << "; its own file " << b.own << ", the largest tensor " << b.largest << ", all " << b.all);
    CHECK(extra < b.largest / 2);
  }
  cpprun::barrier(group());
  if (rank == 0) fs::remove_all(dir);
}

// DIR made a directory each rank sees as its own: its writers' temporary files are links into the
// rank's working directory (through /proc/self/cwd), which is VIEW, a directory of its own or one
// it shares with some ranks (a "node"); what a save into a node-local path on several nodes meets.
// Collective; leave() (collective too) puts the working directory back and removes both.
class UnsharedDirectory {
 public:
  UnsharedDirectory(std::string dir, std::string view) : dir_(std::move(dir)), view_(std::move(view)) {
    fs::create_directories(view_);
    cpprun::barrier(group());
    fs::current_path(view_);
    if (group().rank() == 0) {
      fs::create_directories(dir_);
      for (int w = 1; w <= group().size(); ++w) {
        const std::string name = cpprun::detail::shard_file_name(w, group().size()) + ".tmp";
        fs::create_symlink("/proc/self/cwd/" + name, dir_ + name);
      }
    }
    cpprun::barrier(group());
  }
  void leave() {
    fs::current_path(before_);
    cpprun::barrier(group());
    std::error_code ignored;  // ranks sharing a view remove it together
    fs::remove_all(view_, ignored);
    if (group().rank() == 0) fs::remove_all(dir_);
    cpprun::barrier(group());
  }

 private:
  std::string dir_, view_;
  fs::path before_ = fs::current_path();
};

// A directory each rank sees as its own (UnsharedDirectory): the save fails on every rank, naming the directory and the way out, and leaves no file of it.
TEST_CASE("state_dict: a ZeRO-3 sharded save into a directory the ranks do not share fails on every rank",
          "[state_dict]") {
  const int rank = group().rank(), world = group().size();
  if (world == 1) return;
  auto model =
      cpprun::FullyShardedDataParallel(seeded_tower(1), group(), cpprun::FsdpOptions().stage(3).wrap_policy(is_linear));
  const std::string dir = scratch("not_shared"), own = scratch("not_shared_rank" + std::to_string(rank));
  const std::string file = cpprun::detail::shard_file_name(1, world);  // writer 0's
  UnsharedDirectory unshared(dir, own);
  const auto attempt = [&] {
    return error_text_of([&] { cpprun::save_state_dict(model, dir, cpprun::StateDictSaveOptions().step(1)); });
  };
  // Every rank opens writer 0's file (and the others' it holds rows of), so every rank fails on
  // its own account.
  SECTION("no file where the writer made one") {
    const std::string error = attempt();
    INFO(error);
    CHECK_THAT(error, Catch::Contains("is not one directory that every rank shares"));
    if (rank != 0) CHECK_THAT(error, Catch::Contains("finds no file at " + dir + file + ".tmp, which rank 0 created"));
  }
  SECTION("another save's file where the writer made one") {
    std::ofstream(own + file + ".tmp") << "an earlier save's temporary file";
    cpprun::barrier(group());
    const std::string error = attempt();
    INFO(error);
    CHECK_THAT(error, Catch::Contains("is not one directory that every rank shares"));
    if (rank != 0) CHECK_THAT(error, Catch::Contains("finds another save's file at " + dir + file + ".tmp"));
  }
  cpprun::barrier(group());
  // Nothing of the save: no file, no index, no temporary file (link).
  const std::set<std::string> left = names_in(dir);
  CHECK(left.empty());
  unshared.leave();
}

// The same for save_async, whose ranks write their rows from the background thread: every rank's
// wait() raises, saying why, and nothing is left. (The save before 2026-12-06 gathered each tensor
// to its writer, and wrote into whatever each writer saw.)
TEST_CASE("state_dict: a ZeRO-3 save_async into a directory the ranks do not share fails on every rank",
          "[state_dict]") {
  const int rank = group().rank(), world = group().size();
  if (world == 1) return;
  auto model =
      cpprun::FullyShardedDataParallel(seeded_tower(1), group(), cpprun::FsdpOptions().stage(3).wrap_policy(is_linear));
  const std::string dir = scratch("async_not_shared"), own = scratch("async_not_shared_rank" + std::to_string(rank));
  UnsharedDirectory unshared(dir, own);
  cpprun::AsyncSave pending = cpprun::save_async(model, dir, cpprun::StateDictSaveOptions().step(1));
  const std::string error = error_text_of([&] { pending.wait(); });
  INFO(error);
  // Every rank writes rows into another writer's file, and so finds out on its own account.
  CHECK_THAT(error, Catch::Contains("is not one directory that every rank shares"));
  if (rank != 0) {
    CHECK_THAT(error, Catch::Contains("finds no file at " + dir + cpprun::detail::shard_file_name(1, world) +
                                      ".tmp, which rank 0 created"));
  }
  cpprun::barrier(group());
  const std::set<std::string> left = names_in(dir);
  CHECK(left.empty());
  unshared.leave();
}

// HSDP with its shard groups on two "nodes" ({0, 1} and {2, 3}, each pair's view of the directory
// its own): every rank's rows go to writers on its own node, so only the check that every rank
// opens writer 0's file (Note [Whose temporary file]) finds that the directory is not shared.
// Without it each node would keep half the files and the save would succeed.
TEST_CASE("state_dict: an HSDP sharded save into a directory each node sees as its own fails on every rank",
          "[state_dict]") {
  const int rank = group().rank();
  if (group().size() != 4) return;
  const cpprun::DeviceMesh mesh(group(), std::vector<int>{2, 2}, std::vector<std::string>{"replicate", "shard"});
  auto model = cpprun::FullyShardedDataParallel(seeded_tower(1), mesh,
                                                cpprun::FsdpOptions().stage(3).wrap_policy(is_linear));
  const std::string dir = scratch("hsdp_not_shared"), node = scratch("hsdp_node" + std::to_string(rank / 2));
  UnsharedDirectory unshared(dir, node);
  const std::string error = error_text_of([&] { cpprun::save_state_dict(model, dir); });
  INFO(error);
  if (rank >= 2) {
    CHECK_THAT(error, Catch::Contains("finds no file at " + dir + cpprun::detail::shard_file_name(1, 4) + ".tmp") &&
                          Catch::Contains("is not one directory that every rank shares"));
  } else {
    CHECK_THAT(error, Catch::Contains("failed on rank"));
  }
  cpprun::barrier(group());
  const std::set<std::string> left = names_in(dir);
  CHECK(left.empty());
  unshared.leave();
}

// The last step of the save fails on one writer only (a directory stands at its file's name, so
// its rename fails) after the other writers put theirs in place: every rank raises, and no file
// of the save, no temporary file and no index is left.
TEST_CASE("state_dict: a ZeRO-3 sharded save whose last file cannot be put in place fails on every rank, leaving none",
          "[state_dict]") {
  const int rank = group().rank(), world = group().size();
  if (world == 1) return;
  auto model =
      cpprun::FullyShardedDataParallel(seeded_tower(1), group(), cpprun::FsdpOptions().stage(3).wrap_policy(is_linear));
  torch::optim::Adam adam(model->parameters(), 1e-2);
  step_once(model, adam);
  const std::string dir = scratch("rename_fails");
  for (const std::string_view stem : {cpprun::detail::kModelStem, cpprun::detail::kOptimizerStem}) {
    INFO(stem);
    const std::string blocked = cpprun::detail::shard_file_name(world, world, stem);  // the last writer's
    if (rank == 0) fs::create_directories(fs::path(dir) / blocked / "in_the_way");
    cpprun::barrier(group());
    const std::string error = error_text_of([&] {
      if (stem == cpprun::detail::kModelStem) {
        cpprun::save_state_dict(model, dir);
      } else {
        cpprun::save_optimizer_state_dict(model, adam, dir);
      }
    });
    INFO(error);
    CHECK_THAT(error, Catch::Contains(rank == world - 1 ? "renaming" : "failed on rank"));
    cpprun::barrier(group());
    const std::set<std::string> left = names_in(dir);
    CHECK(left == std::set<std::string>{blocked});
    cpprun::barrier(group());
    if (rank == 0) fs::remove_all(dir);
    cpprun::barrier(group());
  }
}

// The same for save_async, whose writers put their files in place from the background thread:
// the last writer's rename fails after the others' (the model's files, and with the optimizer,
// the optimizer's but the last): every rank's wait() raises, each naming the rename, and no file
// of the save, no temporary file and no index is left.
TEST_CASE("state_dict: a ZeRO-3 save_async whose last file cannot be put in place fails on every rank, leaving none",
          "[state_dict]") {
  const int rank = group().rank(), world = group().size();
  if (world == 1) return;
  auto model =
      cpprun::FullyShardedDataParallel(seeded_tower(1, 101), group(),
                                       cpprun::FsdpOptions().stage(3).wrap_policy(is_linear));
  torch::optim::AdamW adamw(model->parameters(), 1e-2);
  step_once(model, adamw);
  const std::string dir = scratch("async_rename_fails");
  for (const bool with_optimizer : {false, true}) {
    INFO((with_optimizer ? "model and optimizer" : "model"));
    const std::string blocked = cpprun::detail::shard_file_name(
        world, world, with_optimizer ? cpprun::detail::kOptimizerStem : cpprun::detail::kModelStem);
    if (rank == 0) fs::create_directories(fs::path(dir) / blocked / "in_the_way");
    cpprun::barrier(group());
    cpprun::AsyncSave pending =
        with_optimizer ? cpprun::save_async(model, adamw, dir, dir) : cpprun::save_async(model, dir);
    const std::string error = error_text_of([&] { pending.wait(); });
    INFO(error);
    CHECK_THAT(error, Catch::Contains("renaming"));
    cpprun::barrier(group());
    const std::set<std::string> left = names_in(dir);
    CHECK(left == std::set<std::string>{blocked});
    cpprun::barrier(group());
    if (rank == 0) fs::remove_all(dir);
    cpprun::barrier(group());
  }
}

// Every parameter and AdamW state tensor this rank holds, set to `value` in place: what training
// may do once save_async returns.
template <typename Model>
void overwrite(Model& model, torch::optim::Optimizer& optimizer, double value) {
  torch::NoGradGuard no_grad;
  for (auto& p : model->parameters()) p.fill_(value);
  for (auto& [key, state] : optimizer.state()) {
    auto& adamw = static_cast<torch::optim::AdamWParamState&>(*state);
    adamw.exp_avg().fill_(value);
    adamw.exp_avg_sq().fill_(value);
  }
}

// The files of a model's (and its optimizer's) directory that `stem` names, with the index.
std::set<std::string> files_of(const std::string& dir, std::string_view stem) {
  std::set<std::string> out{cpprun::detail::index_file_name(stem)};
  for (const auto& [name, file] : cpprun::detail::read_sharded_directory(dir, stem).file_of) out.insert(file);
  return out;
}

TEST_CASE("state_dict: save_async to a directory writes the synchronous save's bytes, copied before it returns",
          "[state_dict]") {
  const int mode = GENERATE(0, 1, 2, 3, 4);  // 0: DDP; 1-3: FSDP stages; 4: HSDP (2 x 2), on 4 ranks only
  if (mode == 4 && group().size() != 4) return;
  INFO("mode " << mode);
  const std::string sync_dir = scratch("sync"), zero_dir = scratch("sync_zero"), async_dir = scratch("async"),
                    both_dir = scratch("async_both");
  const auto options = cpprun::StateDictSaveOptions().step(5).save_id("fedcba9876543210fedcba9876543210");
  auto check = [&](auto& model) {
    torch::optim::AdamW adamw(model->parameters(), 1e-2);
    step_once(model, adamw);
    cpprun::save_state_dict(model, sync_dir, options);
    cpprun::save_optimizer_state_dict(model, adamw, sync_dir, options);
    {
      auto pending = cpprun::save_async(model, async_dir, options);
      // Training goes on while the files are written: a step (FSDP's gathers and all), then every
      // tensor overwritten in place. The save's tensors were copied: none of its files changes.
      step_once(model, adamw);
      overwrite(model, adamw, 7.0);
      pending.wait();
    }
    overwrite(model, adamw, 0.0);  // the saves below are of these
    cpprun::save_state_dict(model, zero_dir, options);
    cpprun::save_optimizer_state_dict(model, adamw, zero_dir, options);
    {
      auto pending = cpprun::save_async(model, adamw, both_dir, both_dir, options);
      step_once(model, adamw);
      overwrite(model, adamw, 3.0);
      pending.wait();
    }
    cpprun::barrier(group());
    // The model's files and index: those of the synchronous save, and nothing else.
    const std::set<std::string> model_files = files_of(sync_dir, cpprun::detail::kModelStem);
    const std::set<std::string> written = names_in(async_dir);
    CHECK(written == model_files);
    for (const auto& name : model_files) {
      INFO(name);
      CHECK(file_bytes(fs::path(async_dir) / name) == file_bytes(fs::path(sync_dir) / name));
    }
    check_same_files(zero_dir, both_dir);  // the model's and the optimizer's
    cpprun::barrier(group());
    if (group().rank() == 0) {
      fs::remove_all(sync_dir);
      fs::remove_all(zero_dir);
      fs::remove_all(async_dir);
      fs::remove_all(both_dir);
    }
  };
  const auto fsdp_options = cpprun::FsdpOptions().stage(mode == 4 ? 3 : std::max(mode, 1)).wrap_policy(is_linear);
  if (mode == 0) {
    auto ddp = cpprun::DistributedDataParallel(seeded_tower(1), group());
    check(ddp);
  } else if (mode == 4) {
    const cpprun::DeviceMesh mesh(group(), std::vector<int>{2, 2}, std::vector<std::string>{"replicate", "shard"});
    auto hsdp = cpprun::FullyShardedDataParallel(seeded_tower(1), mesh, fsdp_options);
    check(hsdp);
  } else {
    auto fsdp = cpprun::FullyShardedDataParallel(seeded_tower(1), group(), fsdp_options);
    check(fsdp);
  }
}

// See Note [Counting the save's tensor memory]: the background save's copy, made before the call
// returns, is each rank's own rows (Note [An asynchronous save in place] in
// checkpoint/async_save.cpp), as DCP's async_save stages each rank's shards, and the blocks its
// rows share with another writer's (at most 64 KiB at each end of a part, sent, and received by
// the writer). The save before (2026-12-06) gathered each writer's files whole: its own tensors
// and a gather's buffer, over the bound below on some rank at every world size (2 to 4).
TEST_CASE("state_dict: a ZeRO-3 save_async to a directory copies each rank's own rows, not the tensors",
          "[state_dict]") {
  const int rank = group().rank(), world = group().size();
  CountingAllocator& counting = counting_allocator();
  auto model =
      cpprun::FullyShardedDataParallel(seeded_tower(1, 1024), group(),
                                       cpprun::FsdpOptions().stage(3).wrap_policy(is_linear));
  torch::optim::AdamW adamw(model->parameters(), 1e-2);
  step_once(model, adamw);
  int64_t rows = 0, tensors = 0;  // this rank's rows of the model's tensors, and how many tensors
  for (const auto& p : model->parameters()) rows += p.nbytes(), ++tensors;
  const std::string dir = scratch("async_memory");
  for (const bool with_optimizer : {false, true}) {
    cpprun::barrier(group());
    const int64_t before = counting.start();
    auto pending = with_optimizer ? cpprun::save_async(model, adamw, dir, dir) : cpprun::save_async(model, dir);
    const int64_t extra = counting.peak - before;  // during the call: the copies and the blocks sent
    pending.wait();
    Bounds b = bounds_of(dir, cpprun::detail::kModelStem, rank);
    if (with_optimizer) {
      const Bounds o = bounds_of(dir, cpprun::detail::kOptimizerStem, rank);
      b = {b.own + o.own, std::max(b.largest, o.largest), b.all + o.all};
    }
    const int64_t parts = with_optimizer ? 3 * tensors : tensors;  // AdamW: exp_avg, exp_avg_sq
    const int64_t copied = with_optimizer ? 3 * rows : rows;
    const int64_t shared_blocks = 2 * 64 * 1024 * parts * (world + 1);  // sent and received, at most
    INFO((with_optimizer ? "model and optimizer" : "model") << " on rank " << rank << " of " << world
         << ": the call's peak extra tensor bytes " << extra << "; its rows " << copied << ", its own files "
         << b.own << ", the largest tensor " << b.largest << ", all " << b.all);
    CHECK(extra <= copied + shared_blocks);
    if (world > 1) CHECK(extra < b.all);
  }
  cpprun::barrier(group());
  if (rank == 0) fs::remove_all(dir);
}

// One rank's failure fails the save on every rank, and none waits for it: a copy that fails during
// the call (the last rank out of memory), under DDP (whose directory save gathers nothing) and
// ZeRO-3; and a write that fails (writer 1's file cannot be created: for ZeRO-3 on the calling
// thread, where its files are created, and still raised by wait(), as before).
// The code before copied after the save had begun everywhere: the other ranks' threads waited for
// the failed rank's file until the group's timeout, past the test's.
TEST_CASE("state_dict: a save_async to a directory that fails on one rank fails on every rank", "[state_dict]") {
  const int rank = group().rank(), world = group().size();
  if (world == 1) return;
  CountingAllocator& counting = counting_allocator();
  const std::string dir = scratch("async_fails"), sync_dir = scratch("async_fails_sync");
  const auto options = cpprun::StateDictSaveOptions().step(2).save_id("00112233445566778899aabbccddeeff");
  auto check = [&](auto& model) {
    torch::optim::AdamW adamw(model->parameters(), 1e-2);
    step_once(model, adamw);
    cpprun::barrier(group());
    // The first copy of a tensor, or of a rank's rows of one (every one of the tower's but its
    // first layer's is >= 8 KiB; what the collectives allocate is smaller).
    if (rank == world - 1) counting.fail_at_least = 8 * 1024;
    CHECK_THROWS_WITH(cpprun::save_async(model, adamw, dir, dir, options),
                      Catch::Matchers::Contains(rank == world - 1 ? "made to fail" : "failed on rank"));
    counting.fail_at_least = 0;
    CHECK(!fs::exists(fs::path(dir) / cpprun::detail::index_file_name(cpprun::detail::kModelStem)));

    // The same save writes once nothing fails.
    cpprun::save_state_dict(model, sync_dir, options);
    cpprun::save_optimizer_state_dict(model, adamw, sync_dir, options);
    cpprun::save_async(model, adamw, dir, dir, options).wait();
    cpprun::barrier(group());
    check_same_files(sync_dir, dir);
    cpprun::barrier(group());
    if (rank == 0) fs::remove_all(dir);
    cpprun::barrier(group());

    // Writer 1 cannot create its file (a directory stands at its temporary name): every rank's
    // wait() throws, and no index names the files of a save that failed.
    const std::string blocked = shard_file_name_of(sync_dir, 1);
    if (rank == 0) fs::create_directories(fs::path(dir) / (blocked + ".tmp") / "in_the_way");
    cpprun::barrier(group());
    auto pending = cpprun::save_async(model, adamw, dir, dir, options);
    CHECK_THROWS_WITH(pending.wait(), Catch::Matchers::Contains(blocked));  // the others say why, too
    cpprun::barrier(group());
    const std::set<std::string> left = names_in(dir);
    CHECK(left == std::set<std::string>{blocked + ".tmp"});  // every file written was removed
    cpprun::barrier(group());
    if (rank == 0) {
      fs::remove_all(dir);
      fs::remove_all(sync_dir);
    }
  };
  SECTION("DDP") {
    auto ddp = cpprun::DistributedDataParallel(seeded_tower(1, 101), group());
    check(ddp);
  }
  SECTION("ZeRO-3") {
    auto fsdp = cpprun::FullyShardedDataParallel(seeded_tower(1, 101), group(),
                                                 cpprun::FsdpOptions().stage(3).wrap_policy(is_linear));
    check(fsdp);
  }
}

// See Note [Counting the save's tensor memory]; the load (checkpoint/parallel_load.h) checks the
// files a rank reads without decoding them into tensors, then each rank reads its own rows straight
// into its shards (Note [Each rank reads its own part] in checkpoint/part_read.cpp): a ZeRO-3 rank
// holds no tensor beyond its shards, and of the optimizer's state its rows (the load made before
// 2026-12-06 held its own files' tensors and the rows it received; before that, the whole model).
TEST_CASE("state_dict: a ZeRO-3 load of a sharded directory holds no tensor beyond its shards, and its rows of the optimizer state",
          "[state_dict]") {
  const int rank = group().rank(), world = group().size();
  CountingAllocator& counting = counting_allocator();
  const std::string dir = scratch("load_memory");
  const auto fsdp_options = cpprun::FsdpOptions().stage(3).wrap_policy(is_linear);
  cpprun::OptimizerStateDict expected_optimizer;
  std::map<std::string, torch::Tensor> expected_model;  // after the step, as saved
  {
    auto saved = cpprun::FullyShardedDataParallel(seeded_tower(1, 101), group(), fsdp_options);
    torch::optim::Adam adam(saved->parameters(), 1e-2);
    step_once(saved, adam);
    cpprun::save_state_dict(saved, dir);
    cpprun::save_optimizer_state_dict(saved, adam, dir);
    expected_optimizer = cpprun::get_optimizer_state_dict(saved, adam);
    for (const auto& item : cpprun::get_model_state_dict(saved)) expected_model[item.key()] = item.value().clone();
  }
  auto model = cpprun::FullyShardedDataParallel(seeded_tower(2, 101), group(), fsdp_options);
  cpprun::barrier(group());
  int64_t before = counting.start();
  cpprun::load_state_dict(model, dir);
  int64_t extra = counting.peak - before;
  Bounds b = bounds_of(dir, cpprun::detail::kModelStem, rank);
  INFO("rank " << rank << " of " << world << ": the model's load's peak extra tensor bytes " << extra
               << "; its own file " << b.own << ", the largest tensor " << b.largest << ", all " << b.all);
  CHECK(extra <= b.largest);  // a staged tensor at most: none is staged here
  // And it loaded: the saved values, whole.
  for (const auto& item : cpprun::get_model_state_dict(model)) {
    INFO(item.key());
    CHECK(torch::equal(item.value(), expected_model.at(item.key())));
  }

  // The optimizer's state, into an optimizer that has stepped (the load replaces its state rather
  // than adding to it): a rank holds its rows of each tensor (as FSDP shards them, ceil(rows / W)
  // rows), the steps whole, and one tensor more as the state is applied, never the whole state.
  torch::optim::Adam adam(model->parameters(), 1e-2);
  step_once(model, adam);
  cpprun::barrier(group());
  before = counting.start();
  cpprun::load_optimizer_state_dict(model, adam, dir);
  extra = counting.peak - before;
  b = bounds_of(dir, cpprun::detail::kOptimizerStem, rank);
  int64_t rows = 0;
  for (const auto& [name, t] : cpprun::detail::read_sharded_directory(dir, cpprun::detail::kOptimizerStem).tensors) {
    rows += t.dim() == 0 ? t.nbytes() : (t.size(0) + world - 1) / world * (t.nbytes() / t.size(0));
  }
  INFO("rank " << rank << " of " << world << ": the optimizer's load's peak extra tensor bytes " << extra
               << "; its rows of the state " << rows << ", the largest tensor " << b.largest << ", all " << b.all);
  CHECK(extra <= rows + b.largest);
  if (world > 1) CHECK(extra < b.all);
  dist_test::check_same_optimizer_state(cpprun::get_optimizer_state_dict(model, adam), expected_optimizer);
  cpprun::barrier(group());
  if (rank == 0) fs::remove_all(dir);
}

// Linear(8, 60) then Linear(60, 2), float64, seeded; 60 divides by 1 to 6 ranks.
torch::nn::Sequential seeded_pair(int seed) {
  torch::manual_seed(seed);
  torch::nn::Sequential net(torch::nn::Linear(8, 60), torch::nn::Linear(60, 2));
  net->to(torch::kDouble);
  return net;
}

// See Note [Each rank reads its own part] in checkpoint/part_read.cpp: a tensor-parallel split is
// read whole into a staging buffer and cut, so the buffer is allocated, and agreed, before the
// first read. Layer 0 column-parallel over every rank (its weight, 3,840 bytes, and bias staged
// whole on each rank; layer 1 read in place): the last rank's first allocation of 3,840 bytes or
// more fails, as a rank out of memory. Every rank raises (that rank its own error, the others
// naming the load), no tensor changed, and the same load then succeeds. (Before, a rank out of
// memory partway through the transfer raised alone, and the others waited in it until the
// group's timeout.)
TEST_CASE("state_dict: a parallel directory load that cannot allocate its buffers on one rank fails on every rank",
          "[state_dict]") {
  const int rank = group().rank(), world = group().size();
  if (world == 1) return;  // a team of one reads the directory on its own, with nothing to agree
  CountingAllocator& counting = counting_allocator();
  const std::string dir = scratch("load_fails");
  const cpprun::ParallelizePlan plan{{"0", cpprun::ColwiseParallel()}};
  {
    auto saved = seeded_pair(1);
    cpprun::parallelize_module(saved.ptr(), group(), plan);
    cpprun::save_state_dict(saved, dir);
  }
  auto net = seeded_pair(2);
  cpprun::parallelize_module(net.ptr(), group(), plan);
  std::map<std::string, torch::Tensor> before;
  for (const auto& item : cpprun::get_model_state_dict(net)) before[item.key()] = item.value().clone();
  cpprun::barrier(group());
  if (rank == world - 1) counting.fail_at_least = 60 * 8 * 8;
  CHECK_THROWS_WITH(cpprun::load_state_dict(net, dir),
                    Catch::Matchers::Contains(rank == world - 1 ? "made to fail" : "allocating the buffers") &&
                        Catch::Matchers::Contains(rank == world - 1 ? "on rank" : "failed on another rank"));
  CHECK(counting.fail_at_least == 0);  // it fired on the last rank (never armed elsewhere)
  counting.fail_at_least = 0;
  for (const auto& item : cpprun::get_model_state_dict(net)) {
    INFO(item.key() << " after the failed load");
    CHECK(torch::equal(item.value(), before.at(item.key())));
  }

  cpprun::load_state_dict(net, dir);
  auto plain = seeded_pair(1);
  for (const auto& item : cpprun::get_model_state_dict(net)) {
    INFO(item.key());
    CHECK(torch::equal(item.value(), plain->named_parameters()[item.key()]));
  }
  cpprun::barrier(group());
  if (rank == 0) fs::remove_all(dir);
}
