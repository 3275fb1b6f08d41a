// Which save id a save into a directory records (checkpoint/save_ids.h): the decision as a pure
// function, then this process's memory by canonical directory, and a plain module's model and
// optimizer saved by two calls with the same options, which load together.
#include "catch.h"
#include <torch/torch.h>

#include <filesystem>
#include <optional>
#include <set>
#include <string>

#include "checkpoint/save_ids.h"
#include "cpprun/optimizer_state_dict.h"
#include "cpprun/state_dict.h"
#include "scratch_files.h"
#include "support/safetensors.h"
#include "support/safetensors_index.h"

namespace {

using cpprun::detail::DirectorySave;
using cpprun::detail::next_directory_save;
const std::set<std::string> kModel{"model"}, kOptimizer{"optimizer"}, kBoth{"model", "optimizer"};

DirectorySave next(const std::optional<DirectorySave>& last, std::optional<int64_t> step,
                   const std::set<std::string>& stems, std::optional<std::string> given = std::nullopt) {
  return next_directory_save(last, given, step, stems, "fresh");
}

std::string index_id(const std::filesystem::path& index) {
  return cpprun::detail::read_safetensors_index(scratch::contents(index), index.string())
      .metadata.at(std::string(cpprun::detail::kSaveIdKey));
}

}  // namespace

TEST_CASE("save ids: the other half of a save joins it; anything else is a new save", "[save_ids]") {
  // Nothing remembered: a new save.
  CHECK(next(std::nullopt, 5, kModel) == DirectorySave{"fresh", 5, kModel});
  // The model, then the optimizer at the same step (or neither with a step): one save, either order.
  const DirectorySave model_at_5{"a", 5, kModel};
  CHECK(next(model_at_5, 5, kOptimizer) == DirectorySave{"a", 5, kBoth});
  CHECK(next(DirectorySave{"a", std::nullopt, kOptimizer}, std::nullopt, kModel) == DirectorySave{"a", std::nullopt, kBoth});
  // Another step, or one with a step and one without: a new save.
  CHECK(next(model_at_5, 6, kOptimizer).save_id == "fresh");
  CHECK(next(model_at_5, std::nullopt, kOptimizer).save_id == "fresh");
  CHECK(next(DirectorySave{"a", std::nullopt, kModel}, 5, kOptimizer).save_id == "fresh");
  // The same stem again (the model saved twice, at the same or no step): a new save.
  CHECK(next(model_at_5, 5, kModel) == DirectorySave{"fresh", 5, kModel});
  CHECK(next(DirectorySave{"a", std::nullopt, kModel}, std::nullopt, kModel).save_id == "fresh");
  CHECK(next(DirectorySave{"a", 5, kBoth}, 5, kOptimizer).save_id == "fresh");
  // Both at once (save_async(model, optimizer, dir, dir)) after the model alone: a new save.
  CHECK(next(model_at_5, 5, kBoth).save_id == "fresh");
  // A given id is taken as it is; joining the stems of the last save when it is that save's.
  CHECK(next(model_at_5, 5, kOptimizer, "b") == DirectorySave{"b", 5, kOptimizer});
  CHECK(next(model_at_5, 5, kOptimizer, "a") == DirectorySave{"a", 5, kBoth});
  // ... and is remembered: the optimizer saved without one after a model saved with one joins it.
  CHECK(next(next(std::nullopt, 5, kModel, "given"), 5, kOptimizer) == DirectorySave{"given", 5, kBoth});
}

TEST_CASE("save ids: the memory is per directory, by its canonical path, and a failed save is forgotten",
          "[save_ids]") {
  scratch::ScratchDir tmp("save_ids_memory");
  const std::string dir = (tmp.path / "ck").string(), other = (tmp.path / "other").string();
  const auto at = [](int64_t step) { return cpprun::StateDictSaveOptions().step(step); };
  const std::string model = cpprun::detail::claim_save_id(dir + "/", at(1), kModel);
  CHECK(model.size() == 32);
  // Another spelling of the same directory joins; another directory does not.
  CHECK(cpprun::detail::claim_save_id(other, at(1), kOptimizer) != model);
  CHECK(cpprun::detail::claim_save_id(tmp.path.string() + "/./ck", at(1), kOptimizer) == model);
  // Both written: the next model save is a new one.
  const std::string second = cpprun::detail::claim_save_id(dir, at(1), kModel);
  CHECK(second != model);
  // Its optimizer's save failed (it wrote nothing): a retry joins the same save again.
  CHECK(cpprun::detail::claim_save_id(dir, at(1), kOptimizer) == second);
  cpprun::detail::forget_failed_save(dir, second, kOptimizer);
  CHECK(cpprun::detail::claim_save_id(dir, at(1), kOptimizer) == second);
}

TEST_CASE("save ids: a module's model and optimizer saved by two calls with the same options load together",
          "[save_ids]") {
  scratch::ScratchDir tmp("save_ids_module");
  torch::manual_seed(0);
  torch::nn::Linear net(4, 3);
  torch::optim::AdamW opt(net->parameters(), torch::optim::AdamWOptions(0.01));
  const auto step = [&] {
    opt.zero_grad();
    net->forward(torch::randn({2, 4})).sum().backward();
    opt.step();
  };
  step();
  const std::string dir = tmp.path.string() + "/ck/";
  for (const std::optional<int64_t> at : {std::optional<int64_t>(1), std::optional<int64_t>()}) {
    INFO("step " << (at ? std::to_string(*at) : "none"));
    const auto options = at ? cpprun::StateDictSaveOptions().step(*at) : cpprun::StateDictSaveOptions();
    cpprun::save_state_dict(net, dir, options);
    cpprun::save_optimizer_state_dict(net, opt, dir, options);
    CHECK(index_id(dir + "model.safetensors.index.json") == index_id(dir + "optimizer.safetensors.index.json"));
    cpprun::load_state_dict(net, dir);
    cpprun::load_optimizer_state_dict(net, opt, dir);
  }
  // Still refused: the optimizer saved at another step than the model.
  cpprun::save_state_dict(net, dir, cpprun::StateDictSaveOptions().step(2));
  step();
  cpprun::save_optimizer_state_dict(net, opt, dir, cpprun::StateDictSaveOptions().step(3));
  CHECK_THROWS_WITH(cpprun::load_optimizer_state_dict(net, opt, dir), Catch::Contains("is from another save"));
  // One call for both, and its reverse; a file path is refused, naming the two calls.
  cpprun::save_state_dict(net, opt, dir, cpprun::StateDictSaveOptions().step(3));
  CHECK(index_id(dir + "model.safetensors.index.json") == index_id(dir + "optimizer.safetensors.index.json"));
  torch::nn::Linear other(4, 3);
  torch::optim::AdamW other_opt(other->parameters(), torch::optim::AdamWOptions(0.5));
  cpprun::load_state_dict(other, other_opt, dir);
  CHECK(torch::equal(other->weight, net->weight));
  CHECK(other_opt.param_groups()[0].options().get_lr() == 0.01);
  const std::string file = tmp.path.string() + "/ck.safetensors";
  CHECK_THROWS_WITH(cpprun::save_state_dict(net, opt, file),
                    Catch::Contains("take a directory") && Catch::Contains("save_optimizer_state_dict(model, optimizer"));
  CHECK_THROWS_WITH(cpprun::load_state_dict(net, opt, file), Catch::Contains("load_optimizer_state_dict"));
  CHECK(!std::filesystem::exists(file));
}
