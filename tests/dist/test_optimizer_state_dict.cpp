// Optimizer state by parameter name (cpprun/optimizer_state_dict.h) through a module, DDP and FSDP:
// training resumed from a saved model and optimizer matches training that never stopped (the
// losses and the parameters, 1e-6), for SGD with momentum, Adam and AdamW, to a file and to a
// directory beside the model's; faults (a truncated file, mixed saves, a missing parameter, another
// shape, another optimizer) are named errors on every rank and change nothing. In memory
// (get_optimizer_state_dict / set_optimizer_state_dict): the dict is what a save writes, bit for
// bit; set into a fresh ZeRO-3 model it trains on as the uninterrupted run (float64, exactly);
// broadcast_from_rank0 and cpu_offload as PyTorch's; a misfit is refused on every rank. Run by
// optimizer_resume.sh with CPPRUN_OPT_PHASE set, "[.opt_resume]" saves on one world size and
// resumes on another.
#include "catch.h"
#include <torch/torch.h>
#include <unistd.h>  // getppid

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/state_dict.h"
#include "support/json.h"
#include "support/safetensors.h"
#include "support/safetensors_index.h"
#include "cpprun/detail/replaced_files.h"
#include "cpprun/cpprun.h"
#include "checkpoint_test_support.h"
#include "dist_test_support.h"

namespace {

namespace fs = std::filesystem;
using dist_test::check_blocked_save_changes_nothing;
using dist_test::directory_contents;
using dist_test::group;

struct Net : torch::nn::Module {
  explicit Net(int64_t hidden = 13, bool extra = false) {
    fc1 = register_module("fc1", torch::nn::Linear(8, hidden));
    fc2 = register_module("fc2", torch::nn::Linear(hidden, 4));
    if (extra) fc3 = register_module("fc3", torch::nn::Linear(4, 4));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto y = fc2(torch::tanh(fc1(x)));
    return fc3 ? fc3(y) : y;
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};

bool is_linear(const torch::nn::Module& m) { return m.as<torch::nn::Linear>() != nullptr; }

std::shared_ptr<Net> seeded(int seed, int64_t hidden = 13, bool extra = false) {
  torch::manual_seed(seed);
  return std::make_shared<Net>(hidden, extra);
}

// "ddp", "zero1", "zero2", "zero3", "hsdp" (4 ranks: 2 replicas x 2 shards, stage 3).
cpprun::DataParallel<Net> wrap(std::shared_ptr<Net> net, const std::string& kind) {
  if (kind == "ddp") return cpprun::DistributedDataParallel(net, group());
  if (kind == "hsdp") {
    const cpprun::DeviceMesh mesh(group(), std::vector<int>{2, 2}, std::vector<std::string>{"replicate", "shard"});
    return cpprun::FullyShardedDataParallel(net, mesh, cpprun::FsdpOptions().stage(3).wrap_policy(is_linear));
  }
  const int stage = kind.back() - '0';
  return cpprun::FullyShardedDataParallel(net, group(), cpprun::FsdpOptions().stage(stage).wrap_policy(is_linear));
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string& kind, std::vector<torch::Tensor> params,
                                                        double lr) {
  if (kind == "sgd") return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(lr).momentum(0.9));
  if (kind == "adam") return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(lr).amsgrad(true));
  return std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(lr).weight_decay(0.05));
}

// Step `step`'s global batch (12 rows: divides by 1, 2, 3 and 4 ranks), the same in every job.
std::pair<torch::Tensor, torch::Tensor> batch(int step) {
  torch::manual_seed(1000 + step);
  return {torch::randn({12, 8}), torch::randn({12, 4})};
}

// One step on this rank's slice; the global batch's mean loss (the same on every rank).
double train_step(cpprun::DataParallel<Net>& model, torch::optim::Optimizer& opt, int step) {
  auto [x, y] = batch(step);
  const int rank = group().rank(), world = group().size();
  opt.zero_grad();
  auto loss = torch::mse_loss(model->forward(dist_test::slice(x, rank, world)), dist_test::slice(y, rank, world));
  loss.backward();
  opt.step();
  auto total = loss.detach().clone();
  cpprun::all_reduce(group(), total);
  return total.item<double>() / world;
}

// The full parameters, by name, on every rank.
std::map<std::string, torch::Tensor> full_parameters(cpprun::DataParallel<Net>& model) {
  model->gather_full_parameters();
  std::map<std::string, torch::Tensor> out;
  for (const auto& item : model->module()->named_parameters()) out[item.key()] = item.value().detach().clone();
  return out;
}

// Equal to the bit by default: a load gives back the saved values, and a resume at the world size
// it was saved at runs the uninterrupted run's operations in its order, so nothing but a defect
// (a state saved in a narrower type, a step count rounded) can part them, on any machine. `atol`
// for a resume at another world size, whose reductions add in another order (float32).
void check_close(const std::map<std::string, torch::Tensor>& a, const std::map<std::string, torch::Tensor>& b,
                 double atol = 0) {
  REQUIRE(a.size() == b.size());
  for (const auto& [name, t] : a) {
    INFO(name << ": max difference " << (t - b.at(name)).abs().max().item<double>());
    if (atol == 0) CHECK(torch::equal(t, b.at(name)));
    if (atol != 0) CHECK(torch::allclose(t, b.at(name), /*rtol=*/0, atol));
  }
}

std::string scratch(const std::string& what) {
  return "/tmp/cpprun_optim_" + what + "_" + std::to_string(::getppid());
}

constexpr int kBefore = 3, kAfter = 3;

// What the fault, save-together and full-disk cases start from: seeded(1) wrapped by `wrapper`
// after one AdamW step (so the optimizer holds state to save), and a scratch path for `what`.
struct SteppedOnce {
  cpprun::DataParallel<Net> model;
  torch::optim::AdamW opt;
  std::string base;
  SteppedOnce(const std::string& wrapper, const std::string& what)
      : model(wrap(seeded(1), wrapper)),
        opt(model->parameters(), torch::optim::AdamWOptions(0.01)),
        base(scratch(what + "_" + wrapper)) {
    train_step(model, opt, 0);
  }
};

// Trains `before` steps, saves model and optimizer to `path` (a directory ending in '/', or a
// stem to which .safetensors is added), trains kAfter more; a fresh model and optimizer (another
// seed, another lr) load the save and train the same kAfter steps: same losses and parameters.
void check_resume(const std::string& wrapper, const std::string& optimizer, const std::string& path,
                  int before = kBefore) {
  INFO(wrapper << " " << optimizer << " " << path << " after " << before << " step(s)");
  const bool dir = path.back() == '/';
  const std::string model_path = dir ? path : path + "_model.safetensors";
  const std::string opt_path = dir ? path : path + "_optimizer.safetensors";
  auto model = wrap(seeded(1), wrapper);
  auto opt = make_optimizer(optimizer, model->parameters(), 0.01);
  for (int s = 0; s < before; ++s) train_step(model, *opt, s);
  std::string id = cpprun::new_save_id();
  const auto options = cpprun::StateDictSaveOptions().step(before).save_id(id);
  cpprun::save_state_dict(model, model_path, options);
  cpprun::save_optimizer_state_dict(model, *opt, opt_path, options);
  std::vector<double> losses;
  for (int s = before; s < before + kAfter; ++s) losses.push_back(train_step(model, *opt, s));
  const auto expected = full_parameters(model);

  auto resumed = wrap(seeded(5), wrapper);
  auto opt2 = make_optimizer(optimizer, resumed->parameters(), 0.5);  // the file's lr wins
  cpprun::load_state_dict(resumed, model_path);
  cpprun::load_optimizer_state_dict(resumed, *opt2, opt_path);
  CHECK(opt2->param_groups()[0].options().get_lr() == 0.01);
  for (int s = before; s < before + kAfter; ++s) {
    CHECK(train_step(resumed, *opt2, s) == losses[s - before]);
  }
  check_close(full_parameters(resumed), expected);
  cpprun::barrier(group());
  if (group().rank() == 0) {
    std::error_code ignored;
    fs::remove_all(dir ? path : "", ignored);
    fs::remove(model_path, ignored), fs::remove(opt_path, ignored);
  }
  cpprun::barrier(group());
}

}  // namespace

TEST_CASE("optimizer_state_dict: resumed training matches uninterrupted training", "[optimizer_state_dict]") {
  const std::string wrapper = GENERATE("ddp", "zero1", "zero2", "zero3");
  const std::string optimizer = GENERATE("sgd", "adam", "adamw");
  check_resume(wrapper, optimizer, scratch(wrapper + "_" + optimizer) + "/");
}

// A step-0 checkpoint (torchtitan's seed checkpoint): the optimizer holds no state yet, and the save
// still records its kind and groups, which a load takes (PyTorch's get_optimizer_state_dict
// initialises the state first; here a parameter without state loads as one without state, which
// the first step initialises alike).
TEST_CASE("optimizer_state_dict: saved before the first step, it loads and training goes on alike",
          "[optimizer_state_dict]") {
  const std::string wrapper = GENERATE("ddp", "zero3");
  const std::string optimizer = GENERATE("sgd", "adamw");
  check_resume(wrapper, optimizer, scratch("step0_" + wrapper + "_" + optimizer) + "/", 0);
  check_resume(wrapper, optimizer, scratch("step0_" + wrapper + "_" + optimizer), 0);
}

TEST_CASE("optimizer_state_dict: one .safetensors file, DDP and ZeRO-3", "[optimizer_state_dict]") {
  const std::string wrapper = GENERATE("ddp", "zero3");
  check_resume(wrapper, "adamw", scratch(wrapper + "_file"));
}

TEST_CASE("optimizer_state_dict: HSDP (2 replicas x 2 shards) resumes as it would have gone on",
          "[optimizer_state_dict]") {
  if (group().size() != 4) return;  // the 2x2 mesh needs 4 ranks
  check_resume("hsdp", "adamw", scratch("hsdp") + "/");
}

TEST_CASE("optimizer_state_dict: a plain module in one process", "[optimizer_state_dict]") {
  if (group().rank() != 0) return;
  auto net = seeded(1);
  torch::optim::AdamW opt(net->parameters(), torch::optim::AdamWOptions(0.01));
  auto [x, y] = batch(0);
  torch::mse_loss(net->forward(x), y).backward();
  opt.step();
  const std::string path = scratch("plain") + "/";
  cpprun::save_optimizer_state_dict(net, opt, path);
  CHECK(fs::exists(path + "optimizer.safetensors.index.json"));
  CHECK(fs::exists(path + "optimizer-00001-of-00001.safetensors"));
  auto net2 = seeded(1);
  torch::optim::AdamW opt2(net2->parameters(), torch::optim::AdamWOptions(0.3));
  cpprun::load_optimizer_state_dict(net2, opt2, path);
  auto& state = static_cast<torch::optim::AdamWParamState&>(*opt2.state().at(net2->fc1->weight.unsafeGetTensorImpl()));
  auto& original = static_cast<torch::optim::AdamWParamState&>(*opt.state().at(net->fc1->weight.unsafeGetTensorImpl()));
  CHECK(state.step() == 1);
  CHECK(torch::equal(state.exp_avg(), original.exp_avg()));
  CHECK(torch::equal(state.exp_avg_sq(), original.exp_avg_sq()));
  fs::remove_all(path);
}

TEST_CASE("optimizer_state_dict: values the optimizer could not step from are refused, nothing loaded",
          "[optimizer_state_dict]") {
  if (group().rank() != 0) return;
  auto net = seeded(1);
  torch::optim::AdamW opt(net->parameters(), torch::optim::AdamWOptions(0.01));
  auto [x, y] = batch(0);
  torch::mse_loss(net->forward(x), y).backward();
  opt.step();
  const std::string dir = scratch("bad_values");
  fs::create_directories(dir);
  const std::string good = dir + "/good.safetensors";
  cpprun::save_optimizer_state_dict(net, opt, good);
  const std::string bytes = cpprun::detail::read_state_dict_bytes(good);
  const auto parsed = cpprun::detail::read_safetensors(bytes, good);
  // The good file, edited: its param groups' text, or one state tensor; the CRC made anew, so that
  // only the value is wrong.
  const auto edited = [&](const std::string& name, const std::string& from, const std::string& to,
                          const std::function<void(cpprun::detail::NamedTensors&)>& change_tensors) {
    auto tensors = cpprun::detail::decode_safetensors(parsed, good);
    if (change_tensors) change_tensors(tensors);
    auto metadata = parsed.metadata;
    metadata.erase(std::string(cpprun::detail::kSafetensorsCrcKey));
    std::string& groups = metadata.at("cpprun_param_groups");
    if (!from.empty()) {
      const auto at = groups.find(from);
      REQUIRE(at != std::string::npos);
      groups.replace(at, from.size(), to);
    }
    const std::string path = dir + "/" + name + ".safetensors";
    cpprun::write_file_atomically(path, cpprun::detail::encode_safetensors(tensors, metadata));
    return path;
  };
  const auto refused_with = [&](const std::string& path, const std::string& why) {
    INFO(path);
    auto fresh = seeded(1);
    torch::optim::AdamW fresh_opt(fresh->parameters(), torch::optim::AdamWOptions(0.5));
    CHECK_THROWS_WITH(cpprun::load_optimizer_state_dict(fresh, fresh_opt, path),
                      Catch::Matchers::Contains(path) && Catch::Matchers::Contains(why) &&
                          Catch::Matchers::Contains("nothing was loaded"));
    CHECK(fresh_opt.state().empty());
    CHECK(fresh_opt.param_groups()[0].options().get_lr() == 0.5);
  };
  char written[40];
  std::snprintf(written, sizeof written, "\"lr\": %.17g", 0.01);
  // std::stod threw a bare std::out_of_range ("stod") for 1e999, and read "1.2.3" as 1.2.
  refused_with(edited("lr_huge", written, "\"lr\": 1e999", nullptr), "option \"lr\" is 1e999, not a finite number");
  refused_with(edited("lr_dots", written, "\"lr\": 1.2.3", nullptr), "\"1.2.3\" is not a JSON number");
  refused_with(edited("lr_negative", written, "\"lr\": -1000", nullptr), "option \"lr\" is -1000, outside");
  refused_with(edited("betas", "\"betas\": [", "\"betas\": [5, 0.5], \"x\": [", nullptr),
               "option \"betas\" is 5, outside");
  // A state tensor's dtype an integer: its values were cast into moments nobody saved.
  refused_with(edited("int_moments", "", "",
                      [](cpprun::detail::NamedTensors& t) {
                        for (auto& [name, tensor] : t) {
                          if (name == "state.fc1.weight.exp_avg") tensor = tensor.to(torch::kInt);
                        }
                      }),
               "\"state.fc1.weight.exp_avg\" is Int, not a floating-point optimizer state");
  refused_with(edited("nan_step", "", "",
                      [](cpprun::detail::NamedTensors& t) {
                        for (auto& [name, tensor] : t) {
                          if (name == "state.fc1.weight.step") tensor = torch::full_like(tensor, NAN);
                        }
                      }),
               "\"state.fc1.weight.step\" is nan, not a count of steps taken");
  // A complex step passed the check (cast to its real part) and threw mid-apply, half-loaded; a
  // fraction was rounded (LibTorch counts steps as int64); a bool is no count.
  const auto step_as = [&](const char* name, const at::Tensor& value) {
    return edited(name, "", "", [value](cpprun::detail::NamedTensors& t) {
      for (auto& [key, tensor] : t) {
        if (key == "state.fc1.weight.step") tensor = value;
      }
    });
  };
  refused_with(step_as("complex_step", at::scalar_tensor(c10::complex<float>(3, 4), at::kComplexFloat)),
               "\"state.fc1.weight.step\" is ComplexFloat, not a count of steps taken");
  refused_with(step_as("bool_step", at::scalar_tensor(true, at::kBool)),
               "\"state.fc1.weight.step\" is Bool, not a count of steps taken");
  refused_with(step_as("fraction_step", at::scalar_tensor(2.5, at::kFloat)),
               "\"state.fc1.weight.step\" is 2.5, not a count of steps taken");
  // Options LibTorch's optimizers lack that change the update: loading would step another way.
  const std::string lr_text = written;
  // (The file writes them as torch.optim.AdamW's state_dict() does, at LibTorch's values.)
  refused_with(edited("maximize", "\"maximize\": false", "\"maximize\": true", nullptr), "option \"maximize\" is true");
  refused_with(edited("not_decoupled", "\"decoupled_weight_decay\": true", "\"decoupled_weight_decay\": false", nullptr),
               "the file's update is Adam's, this optimizer is AdamW. Build a torch::optim::Adam");
  // Those that do not change it are taken, whatever their values.
  {
    auto net2 = seeded(1);
    torch::optim::AdamW opt2(net2->parameters(), torch::optim::AdamWOptions(0.5));
    cpprun::load_optimizer_state_dict(
        net2, opt2,
        edited("torch_keys", "\"foreach\": null, \"capturable\": false, \"differentiable\": false, \"fused\": null",
               "\"foreach\": true, \"capturable\": true, \"differentiable\": true, \"fused\": false", nullptr));
    CHECK(opt2.param_groups()[0].options().get_lr() == 0.01);
  }
  // A subnormal (Python's json writes 1e-310 so) is a double, loaded as written.
  {
    auto net2 = seeded(1);
    torch::optim::AdamW opt2(net2->parameters(), torch::optim::AdamWOptions(0.5));
    cpprun::load_optimizer_state_dict(net2, opt2, edited("lr_subnormal", written, "\"lr\": 1e-310", nullptr));
    CHECK(opt2.param_groups()[0].options().get_lr() == 1e-310);
  }
  // The untouched file still loads.
  auto fresh = seeded(1);
  torch::optim::AdamW fresh_opt(fresh->parameters(), torch::optim::AdamWOptions(0.5));
  cpprun::load_optimizer_state_dict(fresh, fresh_opt, good);
  CHECK(fresh_opt.param_groups()[0].options().get_lr() == 0.01);
  fs::remove_all(dir);
}

// torch.optim's load_state_dict takes the file's options, amsgrad among them: a file saved with
// amsgrad loads into an AdamW built without it, which then keeps max_exp_avg_sq (the check of what
// state each parameter holds once refused it as "not AdamW's state").
TEST_CASE("optimizer_state_dict: the file's amsgrad wins, with its max_exp_avg_sq", "[optimizer_state_dict]") {
  if (group().rank() != 0) return;
  auto net = seeded(1);
  torch::optim::AdamW opt(net->parameters(), torch::optim::AdamWOptions(0.01).amsgrad(true));
  auto [x, y] = batch(0);
  torch::mse_loss(net->forward(x), y).backward();
  opt.step();
  const std::string dir = scratch("amsgrad");
  fs::create_directories(dir);
  const std::string path = dir + "/amsgrad.safetensors";
  cpprun::save_optimizer_state_dict(net, opt, path);
  auto fresh = seeded(1);
  torch::optim::AdamW fresh_opt(fresh->parameters(), torch::optim::AdamWOptions(0.5));
  cpprun::load_optimizer_state_dict(fresh, fresh_opt, path);
  const auto& options = static_cast<const torch::optim::AdamWOptions&>(fresh_opt.param_groups()[0].options());
  CHECK(options.amsgrad());
  const auto& p = opt.param_groups()[0].params()[0];
  const auto& q = fresh_opt.param_groups()[0].params()[0];
  const auto& saved = static_cast<torch::optim::AdamWParamState&>(*opt.state().at(p.unsafeGetTensorImpl()));
  const auto& loaded = static_cast<torch::optim::AdamWParamState&>(*fresh_opt.state().at(q.unsafeGetTensorImpl()));
  REQUIRE(loaded.max_exp_avg_sq().defined());
  CHECK(torch::equal(loaded.max_exp_avg_sq(), saved.max_exp_avg_sq()));
  fs::remove_all(dir);
}

namespace {

// What the optimizer holds, to check that a refused load changed nothing.
std::vector<torch::Tensor> optimizer_tensors(torch::optim::Optimizer& opt) {
  std::vector<torch::Tensor> out;
  for (const auto& p : opt.param_groups()[0].params()) {
    auto found = opt.state().find(p.unsafeGetTensorImpl());
    if (found == opt.state().end()) continue;
    out.push_back(static_cast<torch::optim::AdamWParamState&>(*found->second).exp_avg().clone());
  }
  return out;
}

void refused(cpprun::DataParallel<Net>& model, torch::optim::AdamW& opt, const std::string& path,
             const std::vector<std::string>& fragments) {
  INFO(path);
  const auto before = optimizer_tensors(opt);
  const double lr = opt.param_groups()[0].options().get_lr();
  try {
    cpprun::load_optimizer_state_dict(model, opt, path);
    FAIL("the load was not refused");
  } catch (const std::exception& e) {
    const std::string message = e.what();
    INFO(message);
    for (const auto& fragment : fragments) CHECK(message.find(fragment) != std::string::npos);
  }
  const auto after = optimizer_tensors(opt);
  REQUIRE(after.size() == before.size());
  for (std::size_t i = 0; i < after.size(); ++i) CHECK(torch::equal(after[i], before[i]));
  CHECK(opt.param_groups()[0].options().get_lr() == lr);
}

}  // namespace

TEST_CASE("optimizer_state_dict: faults are named errors on every rank, and change nothing",
          "[optimizer_state_dict]") {
  const std::string wrapper = GENERATE("ddp", "zero3");
  INFO(wrapper);
  const int rank = group().rank();
  SteppedOnce start(wrapper, "faults");
  auto& [model, opt, base] = start;
  const std::string dir = base + "/";
  const auto options = cpprun::StateDictSaveOptions().step(1).save_id("aaaa");
  cpprun::save_state_dict(model, dir, options);
  cpprun::save_optimizer_state_dict(model, opt, dir, options);
  const std::string file = base + "_opt.safetensors";
  cpprun::save_optimizer_state_dict(model, opt, file, options);
  // Other models' and optimizers' files, rank 0 alone.
  const std::string wider = base + "_wider.safetensors", extra = base + "_extra.safetensors",
                    sgd = base + "_sgd.safetensors", truncated = base + "_truncated.safetensors";
  const std::string mixed = base + "_mixed/";
  if (rank == 0) {
    auto save_plain = [&](std::shared_ptr<Net> net, torch::optim::Optimizer& o, const std::string& path) {
      auto [x, y] = batch(0);
      o.zero_grad();
      torch::mse_loss(net->forward(x), y).backward();
      o.step();
      cpprun::save_optimizer_state_dict(net, o, path);
    };
    auto w = seeded(1, 9);
    torch::optim::AdamW ow(w->parameters(), torch::optim::AdamWOptions(0.01));
    save_plain(w, ow, wider);
    auto e = seeded(1, 13, true);
    torch::optim::AdamW oe(e->parameters(), torch::optim::AdamWOptions(0.01));
    save_plain(e, oe, extra);
    auto s = seeded(1);
    torch::optim::SGD os(s->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
    save_plain(s, os, sgd);
    std::ifstream in(file, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream(truncated, std::ios::binary) << bytes.substr(0, bytes.size() - 10);
    // The model's index from one save, the optimizer's from another.
    cpprun::save_optimizer_state_dict(e, oe, mixed, cpprun::StateDictSaveOptions().save_id("bbbb"));
    fs::copy_file(dir + "model.safetensors.index.json", mixed + "model.safetensors.index.json");
  }
  cpprun::barrier(group());
  // The fc3 parameters are unexpected (and the model has the same others): rename to check ids.
  refused(model, opt, truncated, {truncated});
  refused(model, opt, wider, {wider, "\"state.fc1.weight.exp_avg\" has shape [9, 8], the model's parameter [13, 8]"});
  refused(model, opt, extra, {extra, "parameters in the file but not in the model (2): fc3.bias, fc3.weight"});
  refused(model, opt, sgd, {sgd, "the file holds SGD's state; this optimizer is AdamW"});
  refused(model, opt, mixed, {"optimizer.safetensors.index.json is from another save (save id \"bbbb\")",
                              "model.safetensors.index.json, save id \"aaaa\""});
  // A model with a parameter the file lacks.
  auto bigger = wrap(seeded(1, 13, true), wrapper);
  torch::optim::AdamW ob(bigger->parameters(), torch::optim::AdamWOptions(0.01));
  refused(bigger, ob, dir, {dir, "parameters missing from the file (2): fc3.bias, fc3.weight"});
  // One optimizer shard from another save (4 ranks write 4 files).
  if (group().size() > 1) {
    const std::string odd = base + "_odd/";
    if (rank == 0) {
      fs::create_directories(odd);
      for (const auto& entry : fs::directory_iterator(dir)) fs::copy_file(entry.path(), odd + entry.path().filename().string());
    }
    cpprun::barrier(group());
    cpprun::save_optimizer_state_dict(model, opt, base + "_other/", cpprun::StateDictSaveOptions().save_id("cccc"));
    if (rank == 0) {
      const std::string shard = "optimizer-00002-of-0000" + std::to_string(group().size()) + ".safetensors";
      fs::copy_file(base + "_other/" + shard, odd + shard, fs::copy_options::overwrite_existing);
    }
    cpprun::barrier(group());
    refused(model, opt, odd, {"does not hold together", "optimizer-00002-of-", "is from another save (save id \"cccc\""});
  }
  // The good ones still load.
  cpprun::load_optimizer_state_dict(model, opt, dir);
  cpprun::load_optimizer_state_dict(model, opt, file);
  cpprun::barrier(group());
  if (rank == 0) {
    for (const auto& p : {base, mixed, base + "_odd", base + "_other"}) fs::remove_all(p);
    for (const auto& p : {file, wider, extra, sgd, truncated}) fs::remove(p);
  }
  cpprun::barrier(group());
}

// optimizer_resume.sh: CPPRUN_OPT_PHASE=save trains kBefore steps at this world size, saves to
// CPPRUN_OPT_DIR, trains kAfter more and saves the parameters then as the reference; =load, at
// another world size, loads the save, trains kAfter steps and compares with the reference.
TEST_CASE("optimizer_state_dict: saved on one world size, resumed on another", "[.opt_resume]") {
  const char* phase = std::getenv("CPPRUN_OPT_PHASE");
  const char* dir_env = std::getenv("CPPRUN_OPT_DIR");
  REQUIRE(phase);
  REQUIRE(dir_env);
  const std::string wrapper = GENERATE("ddp", "zero3");
  const std::string dir = std::string(dir_env) + "/" + wrapper + "/";
  const std::string reference = std::string(dir_env) + "/" + wrapper + "_reference.safetensors";
  if (std::string(phase) == "save") {
    auto model = wrap(seeded(1), wrapper);
    auto opt = make_optimizer("adamw", model->parameters(), 0.01);
    for (int s = 0; s < kBefore; ++s) train_step(model, *opt, s);
    const auto options = cpprun::StateDictSaveOptions().step(kBefore).save_id(cpprun::new_save_id());
    cpprun::save_state_dict(model, dir, options);
    cpprun::save_optimizer_state_dict(model, *opt, dir, options);
    for (int s = kBefore; s < kBefore + kAfter; ++s) train_step(model, *opt, s);
    cpprun::save_state_dict(model, reference);
  } else {
    auto model = wrap(seeded(5), wrapper);
    auto opt = make_optimizer("adamw", model->parameters(), 0.5);
    cpprun::load_state_dict(model, dir);
    cpprun::load_optimizer_state_dict(model, *opt, dir);
    for (int s = kBefore; s < kBefore + kAfter; ++s) train_step(model, *opt, s);
    auto expected = seeded(7);
    cpprun::load_state_dict(expected, reference);
    std::map<std::string, torch::Tensor> want;
    for (const auto& item : expected->named_parameters()) want[item.key()] = item.value().detach();
    check_close(full_parameters(model), want, /*atol=*/1e-6);  // a simulation of such a resume: 8.9e-8 at worst
  }
}

namespace {

// A tied output layer: head.weight is emb.weight. `head_first` registers the head first, so that
// the tensor's first name is "head.weight" (as in a model whose file names it so).
struct TiedHead : torch::nn::Module {
  explicit TiedHead(torch::Tensor embedding) { weight = register_parameter("weight", std::move(embedding)); }
  torch::Tensor weight;
};
struct TiedNet : torch::nn::Module {
  explicit TiedNet(bool head_first) {
    torch::manual_seed(5);
    auto table = torch::nn::Embedding(6, 4);
    auto linear = torch::nn::Linear(4, 4);
    if (head_first) head = register_module("head", std::make_shared<TiedHead>(table->weight));
    emb = register_module("emb", table);
    mid = register_module("mid", linear);
    if (!head_first) head = register_module("head", std::make_shared<TiedHead>(table->weight));
  }
  torch::Tensor forward(const torch::Tensor& ids) { return torch::matmul(mid(emb(ids)), head->weight.t()); }
  torch::nn::Embedding emb{nullptr};
  torch::nn::Linear mid{nullptr};
  std::shared_ptr<TiedHead> head;
};

// The JSON header of a .safetensors file.
std::string safetensors_header(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  uint64_t size = 0;
  in.read(reinterpret_cast<char*>(&size), 8);
  std::string header(size, '\0');
  in.read(header.data(), static_cast<std::streamsize>(size));
  return header;
}

torch::Tensor exp_avg_of(torch::optim::AdamW& opt, const torch::Tensor& param) {
  return static_cast<torch::optim::AdamWParamState&>(*opt.state().at(param.unsafeGetTensorImpl())).exp_avg();
}

}  // namespace

// PyTorch 2.15's get_optimizer_state_dict(flatten_optimizer_state_dict=True) names a tied
// parameter's state by its first name only; set_optimizer_state_dict takes a file naming it by
// either of its names (checked with a tiny nn.Module whose head.weight is emb.weight).
TEST_CASE("optimizer_state_dict: a tied parameter's state is saved under its first name, loads by either",
          "[optimizer_state_dict]") {
  if (group().rank() != 0) return;
  const std::string dir = scratch("tied");
  fs::create_directories(dir);
  const auto ids = torch::tensor({1, 2, 5}, torch::kLong);
  auto stepped = [&](bool head_first) {
    auto net = std::make_shared<TiedNet>(head_first);
    auto opt = std::make_shared<torch::optim::AdamW>(cpprun::unique_parameters(*net), torch::optim::AdamWOptions(0.01));
    net->forward(ids).sum().backward();
    opt->step();
    return std::make_pair(net, opt);
  };
  auto [emb_first, emb_opt] = stepped(false);
  auto [head_first, head_opt] = stepped(true);
  REQUIRE(torch::equal(exp_avg_of(*emb_opt, emb_first->emb->weight), exp_avg_of(*head_opt, head_first->emb->weight)));
  const std::string by_emb = dir + "/by_emb.safetensors", by_head = dir + "/by_head.safetensors";
  cpprun::save_optimizer_state_dict(emb_first, *emb_opt, by_emb);
  cpprun::save_optimizer_state_dict(head_first, *head_opt, by_head);
  const std::string emb_header = safetensors_header(by_emb), head_header = safetensors_header(by_head);
  CHECK(emb_header.find("\"state.emb.weight.exp_avg\"") != std::string::npos);
  CHECK(emb_header.find("state.head.weight") == std::string::npos);
  CHECK(head_header.find("\"state.head.weight.exp_avg\"") != std::string::npos);
  CHECK(head_header.find("state.emb.weight") == std::string::npos);
  // Each file loads into the model that names the tensor the other way round.
  for (const bool load_head_first : {false, true}) {
    auto net = std::make_shared<TiedNet>(load_head_first);
    torch::optim::AdamW opt(cpprun::unique_parameters(*net), torch::optim::AdamWOptions(0.5));
    cpprun::load_optimizer_state_dict(net, opt, load_head_first ? by_emb : by_head);
    CHECK(torch::equal(exp_avg_of(opt, net->emb->weight), exp_avg_of(*emb_opt, emb_first->emb->weight)));
    CHECK(opt.param_groups()[0].options().get_lr() == 0.01);
  }
  // A file naming the one tensor's state under both names is refused (PyTorch refuses it too).
  {
    const std::string bytes = cpprun::detail::read_state_dict_bytes(by_emb);
    const auto parsed = cpprun::detail::read_safetensors(bytes, by_emb);
    auto tensors = cpprun::detail::decode_safetensors(parsed, by_emb);
    const auto count = tensors.size();
    for (std::size_t i = 0; i < count; ++i) {
      const std::string name = tensors[i].first;
      if (name.rfind("state.emb.weight.", 0) == 0) {
        tensors.emplace_back("state.head.weight." + name.substr(17), tensors[i].second.clone());
      }
    }
    auto metadata = parsed.metadata;
    metadata.erase(std::string(cpprun::detail::kSafetensorsCrcKey));  // encode adds the new one
    const std::string twice = dir + "/twice.safetensors";
    cpprun::write_file_atomically(twice, cpprun::detail::encode_safetensors(tensors, metadata));
    auto net = std::make_shared<TiedNet>(false);
    torch::optim::AdamW opt(cpprun::unique_parameters(*net), torch::optim::AdamWOptions(0.5));
    CHECK_THROWS_WITH(cpprun::load_optimizer_state_dict(net, opt, twice),
                      Catch::Matchers::Contains("under two names") && Catch::Matchers::Contains("emb.weight"));
    CHECK(opt.state().empty());
    // Param groups of far more values than a model of these parameters could have (a list of
    // 10 million zeros, 20 MB, once took 1.4 GB to parse before it was refused) are refused as
    // they are read, the parse bounded by the model's parameters (Note [Bounded unpickling]'s kin).
    auto bloated = parsed.metadata;
    bloated.erase(std::string(cpprun::detail::kSafetensorsCrcKey));
    std::string zeros = "[";
    for (int i = 0; i < 100000; ++i) zeros += "0,";
    bloated["cpprun_param_groups"] = zeros + "0]";
    const std::string groups_bomb = dir + "/groups_bomb.safetensors";
    cpprun::write_file_atomically(groups_bomb, cpprun::detail::encode_safetensors(
                                                   cpprun::detail::decode_safetensors(parsed, by_emb), bloated));
    CHECK_THROWS_WITH(cpprun::load_optimizer_state_dict(net, opt, groups_bomb),
                      Catch::Matchers::Contains("\"cpprun_param_groups\" is not valid JSON") &&
                          Catch::Matchers::Contains(" values"));
    CHECK(opt.state().empty());
  }
  fs::remove_all(dir);
}

namespace {

// The "cpprun_save_id" a directory's index of STEM records.
std::string index_save_id(const std::string& dir, const std::string& stem) {
  const std::string path = dir + stem + ".safetensors.index.json";
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return cpprun::detail::read_safetensors_index(bytes, path).metadata.at("cpprun_save_id");
}

}  // namespace

// The trap of issue 41: the model's save and the optimizer's, two calls with the same options and
// no save id, as anyone writes them, made a checkpoint whose optimizer load refused "from another
// save". Now the second joins the first (checkpoint/save_ids.h); saves of other steps are still refused.
TEST_CASE("optimizer_state_dict: a model and its optimizer saved by two calls with the same options load together",
          "[optimizer_state_dict]") {
  const std::string wrapper = GENERATE("ddp", "zero3");
  INFO(wrapper);
  const int rank = group().rank();
  SteppedOnce start(wrapper, "together");
  auto& [model, opt, base] = start;
  const std::string dir = base + "/";
  const auto load_both = [&] {
    auto other = wrap(seeded(5), wrapper);
    torch::optim::AdamW other_opt(other->parameters(), torch::optim::AdamWOptions(0.5));
    cpprun::load_state_dict(other, dir);
    cpprun::load_optimizer_state_dict(other, other_opt, dir);
    CHECK(other_opt.param_groups()[0].options().get_lr() == 0.01);
    check_close(full_parameters(other), full_parameters(model));
  };
  // At a step, and with no options at all.
  for (const auto& options : {cpprun::StateDictSaveOptions().step(1), cpprun::StateDictSaveOptions()}) {
    cpprun::save_state_dict(model, dir, options);
    cpprun::save_optimizer_state_dict(model, opt, dir, options);
    load_both();
  }
  // The model in the background, the optimizer after it.
  train_step(model, opt, 1);
  cpprun::save_async(model, dir, cpprun::StateDictSaveOptions().step(2)).wait();
  cpprun::save_optimizer_state_dict(model, opt, dir, cpprun::StateDictSaveOptions().step(2));
  load_both();
  if (rank == 0) CHECK(index_save_id(dir, "model") == index_save_id(dir, "optimizer"));
  // The optimizer at another step than the model: two saves, still refused.
  train_step(model, opt, 2);
  cpprun::save_optimizer_state_dict(model, opt, dir, cpprun::StateDictSaveOptions().step(3));
  refused(model, opt, dir, {"optimizer.safetensors.index.json is from another save", "model.safetensors.index.json"});
  // The model at the optimizer's step is that save's other half; saved again, a new save.
  cpprun::save_state_dict(model, dir, cpprun::StateDictSaveOptions().step(3));
  load_both();
  cpprun::save_state_dict(model, dir, cpprun::StateDictSaveOptions().step(3));
  refused(model, opt, dir, {"is from another save"});
  // One call for both, and its reverse.
  cpprun::save_state_dict(model, opt, dir, cpprun::StateDictSaveOptions().step(3));
  load_both();
  auto other = wrap(seeded(5), wrapper);
  torch::optim::AdamW other_opt(other->parameters(), torch::optim::AdamWOptions(0.5));
  const auto report = cpprun::load_state_dict(other, other_opt, dir);
  CHECK(report.missing_keys.empty());
  CHECK(other_opt.param_groups()[0].options().get_lr() == 0.01);
  check_close(full_parameters(other), full_parameters(model));
  CHECK_THROWS_WITH(cpprun::save_state_dict(model, opt, base + ".safetensors"),
                    Catch::Contains("take a directory") && Catch::Contains("save_optimizer_state_dict(model, optimizer"));
  cpprun::barrier(group());
  if (rank == 0) fs::remove_all(base);
  cpprun::barrier(group());
}

// Note [A failed save puts the previous files back]: a save over a checkpoint that fails after some
// of its files are in place (here the optimizer's last file, whose temporary name a directory takes
// on rank 0) leaves the earlier checkpoint as it was, byte for byte, and loadable: the model's files,
// which the failed save had replaced, come back, and no NAME.prev stays. It used to leave neither
// checkpoint (the model's new files removed, or beside the old optimizer).
TEST_CASE("optimizer_state_dict: a save over a checkpoint that fails puts the earlier checkpoint back",
          "[optimizer_state_dict]") {
  const std::string wrapper = GENERATE("ddp", "zero3");
  const std::string how = GENERATE("together", "async", "async files");
  INFO(wrapper << ", " << how);
  const int rank = group().rank();
  SteppedOnce start(wrapper, "put_back");
  auto& [model, opt, base] = start;
  const bool files = how == "async files";
  const std::string model_path = files ? base + "/model.safetensors" : base + "/";
  const std::string opt_path = files ? base + "/optimizer.safetensors" : base + "/";
  const auto save = [&](int step) {
    const auto options = cpprun::StateDictSaveOptions().step(step);
    if (how == "together") {
      cpprun::save_state_dict(model, opt, base + "/", options);
    } else {
      cpprun::save_async(model, opt, model_path, opt_path, options).wait();
    }
  };
  const auto contents = [&] { return directory_contents(base); };  // rank 0's view
  const auto loads = [&](const std::map<std::string, torch::Tensor>& expected) {
    auto other = wrap(seeded(5), wrapper);
    torch::optim::AdamW other_opt(other->parameters(), torch::optim::AdamWOptions(0.5));
    cpprun::load_state_dict(other, model_path);
    cpprun::load_optimizer_state_dict(other, other_opt, opt_path);
    CHECK(other_opt.param_groups()[0].options().get_lr() == 0.01);
    check_close(full_parameters(other), expected);
  };
  if (rank == 0) {
    fs::remove_all(base);
    if (files) fs::create_directories(base);  // a file's save makes no directory, as torch.save
  }
  cpprun::barrier(group());
  save(1);
  const auto at_step_1 = full_parameters(model);
  const auto saved = rank == 0 ? contents() : std::map<std::string, std::string>();
  train_step(model, opt, 1);
  const std::string last = files ? "optimizer.safetensors" : "optimizer.safetensors.index.json";
  check_blocked_save_changes_nothing(base, last, [&] { save(2); }, saved);
  loads(at_step_1);
  // With the way clear, the same save goes through, and keeps nothing of the earlier one.
  save(2);
  loads(full_parameters(model));
  if (rank == 0) {
    for (const auto& [name, bytes] : contents()) CHECK(name.find(".prev") == std::string::npos);
  }
  // A directory that cannot be made is named, with the reason (it was the filesystem's bare
  // "cannot create directories"), on the rank that made it.
  const std::string under_a_file = base + "/model.safetensors.index.json/ckpt/";
  if (files) {
    cpprun::barrier(group());
  } else if (how == "together") {
    const auto error = [&] {
      try {
        cpprun::save_state_dict(model, opt, under_a_file);
      } catch (const std::exception& e) {
        return std::string(e.what());
      }
      return std::string("no error");
    }();
    INFO(error);
    if (rank == 0) CHECK_THAT(error, Catch::Contains("cannot create the checkpoint directory " + under_a_file));
    CHECK(error != "no error");
  } else {
    CHECK_THROWS_WITH(cpprun::save_async(model, opt, under_a_file, under_a_file).wait(),
                      Catch::Contains("cannot create the checkpoint directory " + under_a_file) ||
                          Catch::Contains("failed on another rank"));
  }
  cpprun::barrier(group());
  if (rank == 0) fs::remove_all(base);
  cpprun::barrier(group());
}

// Note [A trainer's files in the save] (checkpoint/save_files.cpp): a trainer's state written after
// the pair's save (train_gpt's trainer.json) could be lost between the two, leaving a new model and
// optimizer beside the earlier trainer.json. Given to the pair save, it is written by the first
// rank only, last, and a save that fails puts back every earlier file, trainer.json included; a
// name that is not a plain file of the directory, or one of the save's own, is refused on every
// rank with the earlier checkpoint left as it was.
TEST_CASE("optimizer_state_dict: a pair save's files (a trainer's state) are one save with the model and optimizer",
          "[optimizer_state_dict]") {
  const std::string wrapper = GENERATE("ddp", "zero3");
  INFO(wrapper);
  const int rank = group().rank();
  SteppedOnce start(wrapper, "trainer_files");
  auto& [model, opt, base] = start;
  if (rank == 0) fs::remove_all(base);
  cpprun::barrier(group());
  // The first rank's files are written; what the others pass is not read.
  const auto files_at = [&](int step) {
    return rank == 0 ? std::map<std::string, std::string>{{"trainer.json", "{\"step\": " + std::to_string(step) + "}"},
                                                          {"notes.txt", "n"}}
                     : std::map<std::string, std::string>{{"trainer.json", "not rank 0's"}};
  };
  const auto save = [&](int step, const std::map<std::string, std::string>& files) {
    cpprun::save_state_dict(model, opt, base + "/", cpprun::StateDictSaveOptions().step(step), files);
  };
  save(1, files_at(1));
  const auto saved = rank == 0 ? directory_contents(base) : std::map<std::string, std::string>();
  if (rank == 0) {
    CHECK(saved.at("trainer.json") == "{\"step\": 1}");
    CHECK(saved.at("notes.txt") == "n");
  }
  // trainer.json cannot be written (a directory stands where its temporary file goes): the save
  // fails on every rank, and the model's and optimizer's files it had replaced come back.
  train_step(model, opt, 1);
  check_blocked_save_changes_nothing(base, "trainer.json", [&] { save(2, files_at(2)); }, saved);
  for (const std::string bad : {"sub/trainer.json", ".trainer.json", "model.safetensors",
                                "optimizer-00001-of-00002.safetensors", "trainer.json.prev"}) {
    INFO(bad);
    std::string error = "no error";
    try {
      save(2, rank == 0 ? std::map<std::string, std::string>{{bad, "x"}} : std::map<std::string, std::string>{});
    } catch (const std::exception& e) {
      error = e.what();
    }
    CHECK_THAT(error, Catch::Contains("\"" + bad + "\"") && Catch::Contains("trainer.json"));
    cpprun::barrier(group());
    if (rank == 0) CHECK(directory_contents(base) == saved);
    cpprun::barrier(group());
  }
  {
    const std::string long_name(251, 'a');  // NAME.prev would not fit a file name
    std::string error = "no error";
    try {
      save(2, rank == 0 ? std::map<std::string, std::string>{{long_name, "x"}} : std::map<std::string, std::string>{});
    } catch (const std::exception& e) {
      error = e.what();
    }
    CHECK_THAT(error, Catch::Contains("a name of 251 bytes") && Catch::Contains("at most 250"));
  }
  save(2, files_at(2));
  cpprun::barrier(group());  // every rank's own NAME.prev goes once the ranks agree, before it returns
  if (rank == 0) {
    const auto now = directory_contents(base);
    CHECK(now.at("trainer.json") == "{\"step\": 2}");
    for (const auto& [name, bytes] : now) CHECK(name.find(".prev") == std::string::npos);
  }
  cpprun::barrier(group());
  if (rank == 0) fs::remove_all(base);
  cpprun::barrier(group());
}

// A process killed mid-save (here, after the model's files were renamed into place and before the
// optimizer's) leaves the files it replaced as NAME.prev: the pair load refuses the mix before
// loading either, names those files, and its command puts the earlier checkpoint back.
TEST_CASE("optimizer_state_dict: a save cut short is refused, and the refusal's command puts the earlier one back",
          "[optimizer_state_dict]") {
  const std::string wrapper = GENERATE("ddp", "zero3");
  INFO(wrapper);
  const int rank = group().rank();
  SteppedOnce start(wrapper, "cut_short");
  auto& [model, opt, base] = start;
  const std::string dir = base + "/";
  if (rank == 0) fs::remove_all(base);
  cpprun::barrier(group());
  cpprun::save_state_dict(model, opt, dir, cpprun::StateDictSaveOptions().step(1));
  const auto at_step_1 = full_parameters(model);
  std::map<std::string, std::string> saved;  // rank 0's view: every file and its bytes
  const auto contents = [&] { return directory_contents(base); };
  if (rank == 0) saved = contents();
  train_step(model, opt, 1);
  {
    // The scope a one-call save opens, ended as a kill ends it: neither put back nor cleared.
    cpprun::detail::ReplacedFiles killed;
    cpprun::save_state_dict(model, dir, cpprun::StateDictSaveOptions().step(2));
    killed.leave();
  }
  cpprun::barrier(group());
  auto other = wrap(seeded(5), wrapper);
  torch::optim::AdamW other_opt(other->parameters(), torch::optim::AdamWOptions(0.5));
  const auto untouched = full_parameters(other);
  std::string error;
  try {
    cpprun::load_state_dict(other, other_opt, dir);
  } catch (const std::exception& e) {
    error = e.what();
  }
  INFO(error);
  const std::string command = "for f in '" + base + "'/*.prev; do mv -f \"$f\" \"${f%.prev}\"; done";
  CHECK_THAT(error, Catch::Contains("the optimizer's files are from another save") &&
                        Catch::Contains("nothing was loaded") && Catch::Contains("model.safetensors.index.json.prev") &&
                        Catch::Contains(command));
  check_close(full_parameters(other), untouched);  // refused before the model's load, not after
  CHECK(other_opt.state().empty());
  cpprun::barrier(group());
  if (rank == 0) {
    CHECK(std::system(command.c_str()) == 0);
    CHECK(contents() == saved);
  }
  cpprun::barrier(group());
  cpprun::load_state_dict(other, other_opt, dir);
  check_close(full_parameters(other), at_step_1);
  CHECK(other_opt.param_groups()[0].options().get_lr() == 0.01);
  cpprun::barrier(group());
  if (rank == 0) fs::remove_all(base);
  cpprun::barrier(group());
}

TEST_CASE("optimizer_state_dict: two files loaded as a pair are refused when they come from different saves",
          "[optimizer_state_dict]") {
  // Note [A pair of files from one save]: a save cut short between its two renames left a new model
  // beside the old optimizer, and the two loads took them without a word.
  const std::string wrapper = GENERATE("ddp", "zero3");
  INFO(wrapper);
  const int rank = group().rank();
  SteppedOnce start(wrapper, "pair");
  auto& [model, opt, base] = start;
  const std::string model_path = base + "_model.safetensors", optimizer_path = base + "_optimizer.safetensors";
  const std::string old_optimizer = base + "_old_optimizer.safetensors";
  cpprun::save_async(model, opt, model_path, old_optimizer).wait();  // save 1
  train_step(model, opt, 1);
  cpprun::save_async(model, opt, model_path, optimizer_path).wait();  // save 2: the model file replaced
  const auto expected = full_parameters(model);
  auto other = wrap(seeded(5), wrapper);
  torch::optim::AdamW other_opt(other->parameters(), torch::optim::AdamWOptions(0.5));
  const auto untouched = full_parameters(other);
  CHECK_THROWS_WITH(cpprun::load_state_dict(other, other_opt, model_path, old_optimizer),
                    Catch::Contains("the optimizer's file is from another save") &&
                        Catch::Contains("nothing was loaded"));
  check_close(full_parameters(other), untouched);
  CHECK(other_opt.state().empty());
  // The pair saved together loads.
  CHECK(cpprun::load_state_dict(other, other_opt, model_path, optimizer_path).missing_keys.empty());
  CHECK(other_opt.param_groups()[0].options().get_lr() == 0.01);
  check_close(full_parameters(other), expected);
  cpprun::barrier(group());
  if (rank == 0) {
    for (const auto& path : {model_path, optimizer_path, old_optimizer}) fs::remove(path);
  }
  cpprun::barrier(group());
}

// Run by full_disk_save.sh (root: a private mount namespace whose CPPRUN_FULL_DISK is a tmpfs
// filled up): the last rank's file of each save is written onto that full disk (its temporary
// name a link there), so that rank fails with ENOSPC while the others write theirs. Every rank
// raises, the files this save wrote are gone from every rank, no index is written, and the
// earlier save in the directory (the model's, when the optimizer's fails) is as it was.
TEST_CASE("optimizer_state_dict: a save that fails on a full disk removes what it wrote", "[.full_disk]") {
  const char* full = std::getenv("CPPRUN_FULL_DISK");
  REQUIRE(full);
  const std::string wrapper = GENERATE("ddp", "zero3");
  INFO(wrapper);
  const int rank = group().rank(), world = group().size(), last = world - 1;
  SteppedOnce start(wrapper, "full_disk");
  auto& [model, opt, base] = start;
  const auto files_in = [](const std::string& dir) {
    std::map<std::string, std::string> out;  // name -> bytes
    for (const auto& entry : fs::directory_iterator(dir)) {
      std::ifstream in(entry.path(), std::ios::binary);
      out[entry.path().filename().string()] =
          std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    }
    return out;
  };
  // The last rank's temporary file of NAME in DIR lands on the full disk.
  const auto onto_full_disk = [&](const std::string& dir, const std::string& name) {
    if (rank == 0) {
      fs::create_directories(dir);
      fs::create_symlink(std::string(full) + "/" + wrapper + "_" + name, dir + "/" + name + ".tmp");
    }
    cpprun::barrier(group());
  };
  const auto fails = [&](const std::function<void()>& save) {
    try {
      save();
      FAIL("the save did not fail");
    } catch (const std::exception& e) {
      INFO(e.what());
      if (rank == last) CHECK_THAT(e.what(), Catch::Contains("No space left on device"));
      else CHECK_THAT(e.what(), Catch::Contains("failed on"));
    }
    cpprun::barrier(group());
  };
  const std::string n = std::to_string(world);
  const std::string shard = "-0000" + n + "-of-0000" + n + ".safetensors";

  // The optimizer's save into a directory holding the model's: the model's files stay as they were.
  const std::string dir = base + "/";
  const auto options = cpprun::StateDictSaveOptions().step(1);
  cpprun::save_state_dict(model, dir, options);
  const auto model_files = rank == 0 ? files_in(dir) : std::map<std::string, std::string>();
  onto_full_disk(base, "optimizer" + shard);
  fails([&] { cpprun::save_optimizer_state_dict(model, opt, dir, options); });
  if (rank == 0) CHECK(files_in(dir) == model_files);
  cpprun::load_state_dict(model, dir);
  // Once there is room, the save goes through and joins the model's save.
  cpprun::save_optimizer_state_dict(model, opt, dir, options);
  cpprun::load_optimizer_state_dict(model, opt, dir);

  // A model's directory, the model and optimizer in the background: nothing of them stays.
  for (const bool background : {false, true}) {
    const std::string fresh = base + (background ? "_async" : "_model");
    onto_full_disk(fresh, "model" + shard);
    if (background) {
      fails([&] { cpprun::save_async(model, opt, fresh + "/", fresh + "/", options).wait(); });
    } else {
      fails([&] { cpprun::save_state_dict(model, fresh + "/", options); });
    }
    if (rank == 0) {
      INFO(fresh);
      CHECK(files_in(fresh).empty());
    }
  }
  // FSDP's earlier sharded format: no rank_<r>.pt and no meta.pt.
  if (wrapper == "zero3") {
    const std::string old = base + "_old";
    onto_full_disk(old, "rank_" + std::to_string(last) + ".pt");
    fails([&] { cpprun::save_sharded_checkpoint(model, opt, old); });
    if (rank == 0) CHECK(files_in(old).empty());
  }
  cpprun::barrier(group());
  if (rank == 0) {
    for (const auto& suffix : {"", "_async", "_model", "_old"}) fs::remove_all(base + suffix);
  }
  cpprun::barrier(group());
}

// ---- get_optimizer_state_dict / set_optimizer_state_dict: the state in memory ----
namespace {

using OptState = cpprun::OptimizerStateDict;

// Two param groups, as a training script's decay / no-decay split: the weights (even indices of
// parameters(): fc1.weight, fc2.weight), the biases at another lr and no weight decay.
std::unique_ptr<torch::optim::Optimizer> make_grouped(const std::string& kind, const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> weights, biases;
  for (std::size_t i = 0; i < params.size(); ++i) (i % 2 ? biases : weights).push_back(params[i]);
  if (kind == "sgd") {
    return std::make_unique<torch::optim::SGD>(
        std::vector<torch::optim::OptimizerParamGroup>{
            {weights, std::make_unique<torch::optim::SGDOptions>(torch::optim::SGDOptions(0.01).momentum(0.9).weight_decay(0.05))},
            {biases, std::make_unique<torch::optim::SGDOptions>(torch::optim::SGDOptions(0.02).momentum(0.8))}},
        torch::optim::SGDOptions(0.01));
  }
  if (kind == "adam") {
    return std::make_unique<torch::optim::Adam>(
        std::vector<torch::optim::OptimizerParamGroup>{
            {weights, std::make_unique<torch::optim::AdamOptions>(torch::optim::AdamOptions(0.01).amsgrad(true))},
            {biases, std::make_unique<torch::optim::AdamOptions>(torch::optim::AdamOptions(0.02).betas({0.8, 0.9}))}},
        torch::optim::AdamOptions(0.01));
  }
  return std::make_unique<torch::optim::AdamW>(
      std::vector<torch::optim::OptimizerParamGroup>{
          {weights, std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(0.01).weight_decay(0.05))},
          {biases, std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(0.02).weight_decay(0))}},
      torch::optim::AdamWOptions(0.01));
}

cpprun::DataParallel<Net> wrap_double(const std::string& kind) {
  auto net = seeded(1);
  net->to(torch::kDouble);
  return wrap(net, kind);
}

// A JSON value of the file's param groups as the in-memory dict should hold it (written here, not
// taken from the library, so that the two are compared, not one with itself).
c10::IValue expected_value(const cpprun::detail::Json& json) {
  using Kind = cpprun::detail::Json::Kind;
  if (json.kind == Kind::kNumber) return std::stod(json.text);
  if (json.kind == Kind::kArray) {
    std::vector<c10::IValue> items;
    for (const auto& item : json.items) items.push_back(expected_value(item));
    return c10::ivalue::Tuple::create(std::move(items));
  }
  if (json.text == "null") return c10::IValue();
  return json.text == "true";
}

// Equal kind and value: tensors of one dtype and shape, bit for bit; doubles exactly.
bool same_value(const c10::IValue& a, const c10::IValue& b) {
  if (a.isTensor() || b.isTensor()) {
    return a.isTensor() && b.isTensor() && a.toTensor().scalar_type() == b.toTensor().scalar_type() &&
           a.toTensor().sizes() == b.toTensor().sizes() && torch::equal(a.toTensor().cpu(), b.toTensor().cpu());
  }
  if (a.isTuple() || b.isTuple()) {
    if (!a.isTuple() || !b.isTuple()) return false;
    const auto& x = a.toTupleRef().elements();
    const auto& y = b.toTupleRef().elements();
    if (x.size() != y.size()) return false;
    for (std::size_t i = 0; i < x.size(); ++i) if (!same_value(x[i], y[i])) return false;
    return true;
  }
  if (a.isDouble() || b.isDouble()) return a.isDouble() && b.isDouble() && a.toDouble() == b.toDouble();
  if (a.isBool() || b.isBool()) return a.isBool() && b.isBool() && a.toBool() == b.toBool();
  return a.isNone() && b.isNone();
}

// The .safetensors file a save wrote, in the flattened form: its tensors, then its groups'
// options under each parameter's name.
OptState read_back(const std::string& path) {
  const std::string bytes = cpprun::detail::read_state_dict_bytes(path);
  const auto parsed = cpprun::detail::read_safetensors(bytes, path);
  OptState out;
  for (auto& [name, tensor] : cpprun::detail::decode_safetensors(parsed, path)) out.insert(name, tensor);
  const auto groups = cpprun::detail::parse_json(parsed.metadata.at("cpprun_param_groups"), 4);
  for (const auto& group : groups.items) {
    for (const auto& [key, params] : group.members) {
      if (key != "params") continue;
      for (const auto& name : params.items) {
        for (const auto& [option, value] : group.members) {
          if (option != "params") out.insert("param_groups." + name.text + "." + option, expected_value(value));
        }
      }
    }
  }
  return out;
}

void check_same_state(const OptState& got, const OptState& expected) {
  CHECK(got.size() == expected.size());
  for (const auto& item : expected) {
    INFO(item.key());
    const auto* found = got.find(item.key());
    REQUIRE(found);
    CHECK(same_value(*found, item.value()));
  }
}

// One step of the float64 model on this rank's slice; the global mean loss.
double train_step_double(cpprun::DataParallel<Net>& model, torch::optim::Optimizer& opt, int step) {
  auto [x, y] = batch(step);
  const int rank = group().rank(), world = group().size();
  opt.zero_grad();
  auto loss = torch::mse_loss(model->forward(dist_test::slice(x, rank, world).to(torch::kDouble)),
                              dist_test::slice(y, rank, world).to(torch::kDouble));
  loss.backward();
  opt.step();
  auto total = loss.detach().clone();
  cpprun::all_reduce(group(), total);
  return total.item<double>() / world;
}

std::pair<std::string, std::string> error_of(const std::function<void()>& run) {
  try {
    run();
  } catch (const cpprun::StateDictMismatchError& e) {
    return {"mismatch", e.what()};
  } catch (const std::exception& e) {
    return {"other", e.what()};
  }
  return {"none", ""};
}

}  // namespace

TEST_CASE("optimizer_state_dict: get_optimizer_state_dict is what a save writes, bit for bit",
          "[optimizer_state_dict]") {
  const std::string wrapper = GENERATE("plain", "ddp", "zero1", "zero2", "zero3");
  const std::string optimizer = GENERATE("sgd", "adam", "adamw");
  INFO(wrapper << " " << optimizer);
  const int rank = group().rank();
  // A plain module's save is this process's own file; a wrapper's, rank 0's for all.
  const std::string path = scratch("get_" + wrapper + "_" + optimizer) + "_" +
                           std::to_string(wrapper == "plain" ? rank : 0) + ".safetensors";
  OptState got, offloaded;
  if (wrapper == "plain") {  // this process alone
    auto net = seeded(1);
    auto opt = make_grouped(optimizer, net->parameters());
    for (int s = 0; s < 2; ++s) {
      auto [x, y] = batch(s);
      opt->zero_grad();
      torch::mse_loss(net->forward(x), y).backward();
      opt->step();
    }
    got = cpprun::get_optimizer_state_dict(net, *opt);
    offloaded = cpprun::get_optimizer_state_dict(net, *opt, cpprun::StateDictOptions().cpu_offload(true));
    cpprun::save_optimizer_state_dict(net, *opt, path);
  } else {
    auto model = wrap(seeded(1), wrapper);
    auto opt = make_grouped(optimizer, model->parameters());
    for (int s = 0; s < 2; ++s) train_step(model, *opt, s);
    got = cpprun::get_optimizer_state_dict(model, *opt);
    offloaded = cpprun::get_optimizer_state_dict(model, *opt, cpprun::StateDictOptions().cpu_offload(true));
    cpprun::save_optimizer_state_dict(model, *opt, path);  // collective: written when it returns
  }
  // Every rank gets the whole state; the file holds the same keys and values.
  const OptState written = read_back(path);
  check_same_state(got, written);
  // PyTorch's keys: each parameter's state, and each of its group's options, under its name.
  const std::size_t states = optimizer == "sgd" ? 1 : optimizer == "adam" ? 3 : 3;  // + step
  const std::size_t amsgrad_weights = optimizer == "adam" ? 2 : 0;                   // max_exp_avg_sq
  const std::size_t options = optimizer == "sgd" ? 9 : 11;
  CHECK(got.size() == 4 * states + amsgrad_weights + 4 * options);
  CHECK(got["param_groups.fc1.bias.lr"].toDouble() == 0.02);
  CHECK(got["param_groups.fc2.weight.lr"].toDouble() == 0.01);
  CHECK(got["state.fc1.weight." + std::string(optimizer == "sgd" ? "momentum_buffer" : "exp_avg")].toTensor().sizes().vec() ==
        std::vector<int64_t>{13, 8});
  if (optimizer != "sgd") {
    CHECK(got["state.fc2.bias.step"].toTensor().scalar_type() == torch::kFloat);
    CHECK(got["state.fc2.bias.step"].toTensor().item<float>() == 2);
    CHECK(got["param_groups.fc1.weight.betas"].toTupleRef().elements().size() == 2);
    CHECK(got["param_groups.fc1.weight.decoupled_weight_decay"].toBool() == (optimizer == "adamw"));
    CHECK(got["param_groups.fc1.weight.foreach"].isNone());
  }
  // cpu_offload: the first rank alone (a plain module: this process), on the CPU.
  if (wrapper == "plain" || rank == 0) {
    check_same_state(offloaded, written);
    for (const auto& item : offloaded) {
      if (item.value().isTensor()) CHECK(item.value().toTensor().device() == torch::Device(torch::kCPU));
    }
  } else {
    CHECK(offloaded.is_empty());
  }
  cpprun::barrier(group());
  if (wrapper == "plain" || rank == 0) std::filesystem::remove(path);
}

TEST_CASE("optimizer_state_dict: got on ZeRO-3, set into a fresh model, training goes on as if never stopped",
          "[optimizer_state_dict]") {
  const std::string optimizer = GENERATE("sgd", "adam", "adamw");
  INFO(optimizer);
  auto model = wrap_double("zero3");
  auto opt = make_grouped(optimizer, model->parameters());
  for (int s = 0; s < kBefore; ++s) train_step_double(model, *opt, s);
  const auto model_state = cpprun::get_model_state_dict(model);
  const OptState state = cpprun::get_optimizer_state_dict(model, *opt);
  std::vector<double> losses;
  for (int s = kBefore; s < kBefore + kAfter; ++s) losses.push_back(train_step_double(model, *opt, s));
  const auto expected = full_parameters(model);

  auto fresh_net = seeded(5);
  fresh_net->to(torch::kDouble);
  auto fresh = wrap(fresh_net, "zero3");
  auto fresh_opt = make_grouped(optimizer, fresh->parameters());
  fresh_opt->param_groups()[0].options().set_lr(0.5);  // the dict's lr must win
  cpprun::set_model_state_dict(fresh, model_state);
  cpprun::set_optimizer_state_dict(fresh, *fresh_opt, state);
  CHECK(fresh_opt->param_groups()[0].options().get_lr() == 0.01);
  for (int s = kBefore; s < kBefore + kAfter; ++s) CHECK(train_step_double(fresh, *fresh_opt, s) == losses[s - kBefore]);
  const auto resumed = full_parameters(fresh);
  for (const auto& [name, tensor] : expected) {
    INFO(name);
    CHECK(torch::equal(resumed.at(name), tensor));  // float64, the same layout: bit for bit
  }
}

TEST_CASE("optimizer_state_dict: set_optimizer_state_dict with broadcast_from_rank0 reads rank 0's dict alone",
          "[optimizer_state_dict]") {
  const std::string wrapper = GENERATE("ddp", "zero3");
  INFO(wrapper);
  SteppedOnce source(wrapper, "broadcast");
  const OptState state = cpprun::get_optimizer_state_dict(source.model, source.opt);
  auto target = wrap(seeded(2), wrapper);
  torch::optim::AdamW target_opt(target->parameters(), torch::optim::AdamWOptions(0.5));
  cpprun::set_optimizer_state_dict(target, target_opt, group().rank() == 0 ? state : OptState(),
                                   cpprun::StateDictOptions().broadcast_from_rank0(true));
  check_same_state(cpprun::get_optimizer_state_dict(target, target_opt), state);
  // Without it, every rank's own dict: an empty one on a rank is refused there, and so everywhere.
  const auto [type, message] = error_of([&] {
    cpprun::set_optimizer_state_dict(target, target_opt, group().rank() == 0 ? state : OptState());
  });
  if (group().size() > 1) CHECK(type == (group().rank() == 0 ? "other" : "mismatch"));
}

TEST_CASE("optimizer_state_dict: a state dict that does not fit is refused on every rank, nothing changed",
          "[optimizer_state_dict]") {
  const std::string wrapper = GENERATE("ddp", "zero3");
  INFO(wrapper);
  const int rank = group().rank();
  SteppedOnce source(wrapper, "refused");
  const OptState good = cpprun::get_optimizer_state_dict(source.model, source.opt);
  // The target has stepped too, with another seed and lr: what it holds must survive every refusal.
  auto target = wrap(seeded(3), wrapper);
  torch::optim::AdamW target_opt(target->parameters(), torch::optim::AdamWOptions(0.5));
  train_step(target, target_opt, 0);
  OptState before;
  for (const auto& item : cpprun::get_optimizer_state_dict(target, target_opt)) {
    before.insert(item.key(), item.value().isTensor() ? c10::IValue(item.value().toTensor().clone()) : item.value());
  }
  // Missing, extra, shape, dtype and a group's disagreeing options: all listed in one error.
  OptState bad;
  for (const auto& item : good) {
    if (item.key().find(".fc2.bias.") != std::string::npos) continue;  // missing
    if (item.key() == "state.fc1.weight.exp_avg") {
      bad.insert(item.key(), torch::zeros({3, 3}));  // shape
    } else if (item.key() == "state.fc1.bias.exp_avg_sq") {
      bad.insert(item.key(), item.value().toTensor().to(torch::kInt));  // dtype
    } else if (item.key() == "param_groups.fc1.bias.lr") {
      bad.insert(item.key(), 0.125);  // one group, two lrs
    } else {
      bad.insert(item.key(), item.value());
    }
  }
  bad.insert("state.fc9.weight.exp_avg", torch::zeros({4, 4}));  // extra
  bad.insert("param_groups.fc9.weight.lr", 0.01);
  for (const bool broadcast : {false, true}) {
    INFO("broadcast_from_rank0 " << broadcast);
    const auto [type, message] = error_of([&] {
      cpprun::set_optimizer_state_dict(target, target_opt, bad, cpprun::StateDictOptions().broadcast_from_rank0(broadcast));
    });
    CHECK(type == "mismatch");
    for (const char* fragment :
         {"set_optimizer_state_dict refused the state dict given", "nothing was changed",
          "parameters missing from the state dict (1): fc2.bias",
          "parameters in the state dict but not in the model (1): fc9.weight",
          "\"state.fc1.weight.exp_avg\" has shape [3, 3], the model's parameter [13, 8]",
          "\"state.fc1.bias.exp_avg_sq\" is Int, not a floating-point optimizer state",
          "\"param_groups.fc1.bias.lr\" is 0.125, \"param_groups.fc1.weight.lr\" 0.01"}) {
      CHECK_THAT(message, Catch::Contains(fragment));
    }
  }
  // Another optimizer's: SGD's state and options, and Adam's (decoupled_weight_decay false).
  {
    auto other = wrap(seeded(1), wrapper);
    torch::optim::SGD sgd(other->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
    train_step(other, sgd, 0);
    const auto [type, message] = error_of([&] {
      cpprun::set_optimizer_state_dict(target, target_opt, cpprun::get_optimizer_state_dict(other, sgd));
    });
    CHECK(type == "mismatch");
    CHECK_THAT(message, Catch::Contains("the state dict holds SGD's state; this optimizer is AdamW"));
    torch::optim::Adam adam(other->parameters(), torch::optim::AdamOptions(0.01));
    train_step(other, adam, 1);
    const auto [adam_type, adam_message] = error_of([&] {
      cpprun::set_optimizer_state_dict(target, target_opt, cpprun::get_optimizer_state_dict(other, adam));
    });
    CHECK(adam_type == "mismatch");
    CHECK_THAT(adam_message, Catch::Contains("the state dict holds Adam's state; this optimizer is AdamW"));
  }
  // One rank's dict alone does not fit: every rank refuses before any changes.
  if (group().size() > 1) {
    const bool last = rank == group().size() - 1;
    const auto [type, message] = error_of([&] { cpprun::set_optimizer_state_dict(target, target_opt, last ? bad : good); });
    CHECK(type == (last ? "mismatch" : "other"));
    CHECK_THAT(message, Catch::Contains(last ? "fc2.bias" : "set_optimizer_state_dict failed"));
  }
  check_same_state(cpprun::get_optimizer_state_dict(target, target_opt), before);
  CHECK(target_opt.param_groups()[0].options().get_lr() == 0.5);
  // The good dict still sets.
  cpprun::set_optimizer_state_dict(target, target_opt, good);
  check_same_state(cpprun::get_optimizer_state_dict(target, target_opt), good);
  CHECK_THROWS_WITH(cpprun::get_optimizer_state_dict(target, target_opt, cpprun::StateDictOptions().file_key_prefix("m.")),
                    Catch::Contains("leave them empty here"));
  CHECK_THROWS_WITH(cpprun::set_optimizer_state_dict(
                        target, target_opt, good, cpprun::StateDictOptions().consume_prefix_in_state_dict_if_present("m.")),
                    Catch::Contains("leave them empty here"));
}
