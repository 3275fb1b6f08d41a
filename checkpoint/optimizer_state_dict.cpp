// See optimizer_state_dict.h.
#include "checkpoint/optimizer_state_dict.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <map>
#include <set>
#include <unordered_map>

#include "core/failure_agreement.h"
#include "checkpoint/directory_read.h"
#include "checkpoint/optimizer_flat_state.h"
#include "checkpoint/rows_in_place.h"
#include "checkpoint/optimizer_state.h"
#include "checkpoint/part_read.h"
#include "checkpoint/sharded_state_dict.h"
#include "checkpoint/state_dict.h"
#include "checkpoint/writer_gather.h"
#include "cpprun/optimizer_state_dict.h"
#include "cpprun/atomic_file.h"
#include "cpprun/checkpoint_file.h"
#include "cpprun/collectives.h"
#include "cpprun/detail/replaced_files.h"
#include "cpprun/object_collectives.h"
#include "support/json.h"
#include "support/safetensors.h"
#include "support/safetensors_index.h"

namespace cpprun::detail {
namespace fs = std::filesystem;
namespace {

// set_optimizer_state_dict: what of the root's dict could not be made into a file, '\n'-separated.
constexpr const char* kDictFaultsKey = "cpprun_dict_faults";
// Every state a known optimizer keeps, for reading only an owner's files of a directory.
constexpr const char* kStateNames[] = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer", "step"};
constexpr int kMaxGroupsDepth = 4;                   // [{"params": [...], "betas": [...]}]

// PyTorch's class name of the optimizer; an error for one we cannot save.
std::string kind_of(torch::optim::Optimizer& optimizer) {
  if (dynamic_cast<torch::optim::AdamW*>(&optimizer)) return "AdamW";
  if (dynamic_cast<torch::optim::Adam*>(&optimizer)) return "Adam";
  if (dynamic_cast<torch::optim::SGD*>(&optimizer)) return "SGD";
  TORCH_CHECK(false, "cpprun: save/load_optimizer_state_dict: cannot name the state of this optimizer (",
              typeid(optimizer).name(), "); supported: torch::optim::SGD, Adam, AdamW.");
}

// The state tensors a parameter of a group holds once stepped (PyTorch's names), "step" aside.
std::vector<std::string> state_names(const torch::optim::OptimizerOptions& options) {
  if (auto* o = dynamic_cast<const torch::optim::AdamWOptions*>(&options)) {
    return o->amsgrad() ? std::vector<std::string>{"exp_avg", "exp_avg_sq", "max_exp_avg_sq"}
                        : std::vector<std::string>{"exp_avg", "exp_avg_sq"};
  }
  if (auto* o = dynamic_cast<const torch::optim::AdamOptions*>(&options)) {
    return o->amsgrad() ? std::vector<std::string>{"exp_avg", "exp_avg_sq", "max_exp_avg_sq"}
                        : std::vector<std::string>{"exp_avg", "exp_avg_sq"};
  }
  if (auto* o = dynamic_cast<const torch::optim::SGDOptions*>(&options)) {
    return o->momentum() != 0 ? std::vector<std::string>{"momentum_buffer"} : std::vector<std::string>{};
  }
  return {};
}
bool has_step(const std::string& kind) { return kind != "SGD"; }

std::string number(double value) { return json_number_text(value); }
const char* boolean(bool value) { return value ? "true" : "false"; }

// A group's options under PyTorch's names, as JSON members.
std::string options_json(const torch::optim::OptimizerOptions& options) {
  const auto member = [](const char* name, const std::string& value) { return ", \"" + std::string(name) + "\": " + value; };
  std::string out = member("lr", number(options.get_lr()));
  const auto adam_like = [&](const auto& o) {
    out += member("betas", "[" + number(std::get<0>(o.betas())) + ", " + number(std::get<1>(o.betas())) + "]") +
           member("eps", number(o.eps())) + member("weight_decay", number(o.weight_decay())) +
           member("amsgrad", boolean(o.amsgrad()));
  };
  // The options torch.optim's groups have and LibTorch's optimizers lack, at the values that give
  // LibTorch's update, as Python's optimizer.state_dict() lists them: the groups are then PyTorch's
  // key for key (get_optimizer_state_dict's "param_groups.<name>.<option>"), and say whether the
  // update is Adam's or AdamW's (decoupled_weight_decay).
  const std::string fixed = member("maximize", "false") + member("foreach", "null");
  const std::string unfused = member("differentiable", "false") + member("fused", "null");
  if (auto* o = dynamic_cast<const torch::optim::AdamWOptions*>(&options)) {
    adam_like(*o);
    out += fixed + member("capturable", "false") + unfused + member("decoupled_weight_decay", "true");
  }
  if (auto* o = dynamic_cast<const torch::optim::AdamOptions*>(&options)) {
    adam_like(*o);
    out += fixed + member("capturable", "false") + unfused + member("decoupled_weight_decay", "false");
  }
  if (auto* o = dynamic_cast<const torch::optim::SGDOptions*>(&options)) {
    out += member("momentum", number(o->momentum())) + member("dampening", number(o->dampening())) +
           member("weight_decay", number(o->weight_decay())) + member("nesterov", boolean(o->nesterov())) + fixed +
           unfused;
  }
  return out;
}

// The groups as the files' __metadata__ holds them: [{"params": [name, ...], "lr": ...}, ...].
std::string param_groups_json(const std::vector<std::vector<std::string>>& params,
                              const std::vector<std::string>& options) {
  std::string groups = "[";
  for (std::size_t g = 0; g < params.size(); ++g) {
    std::string list;
    for (const auto& name : params[g]) {
      if (!list.empty()) list += ", ";
      append_json_string(list, name);
    }
    groups += (g ? ", " : "") + std::string("{\"params\": [") + list + "]" + options[g] + "}";
  }
  return groups + "]";
}

// A number from MIN to below MAX (or to MAX, `max_included`), the range torch.optim's
// constructors accept for the option (a file cannot set what the constructor refuses).
double json_number(const Json& value, const std::string& what, double min = 0,
                   double max = std::numeric_limits<double>::infinity(), bool max_included = true) {
  const std::optional<double> number = json_double(value);
  TORCH_CHECK(number, what, " is ", value.kind == Json::Kind::kNumber ? value.text : "not a number",
              ", not a finite number");
  TORCH_CHECK(*number >= min && (max_included ? *number <= max : *number < max), what, " is ", value.text,
              ", outside what torch.optim accepts (from ", min, max_included ? " to " : " to below ", max, ")");
  return *number;
}
bool json_null(const Json& value) { return value.kind == Json::Kind::kOther && value.text == "null"; }
bool json_bool(const Json& value, const std::string& what) {
  TORCH_CHECK(value.kind == Json::Kind::kOther && (value.text == "true" || value.text == "false"), "cpprun: ", what,
              " is not true or false");
  return value.text == "true";
}

// Sets a group's options from the file's JSON object (names PyTorch's). Options that do not change
// the update (foreach, fused, capturable, differentiable, initial_lr, ...) are ignored; two that
// change it and that LibTorch's optimizers lack are refused: maximize, and Adam's
// decoupled_weight_decay (AdamW's update under Adam's name).
void apply_options(torch::optim::OptimizerOptions& options, const Json& group, const std::string& where) {
  const bool adam = dynamic_cast<torch::optim::AdamOptions*>(&options) != nullptr;
  const bool adamw = dynamic_cast<torch::optim::AdamWOptions*>(&options) != nullptr;
  for (const auto& [key, value] : group.members) {
    const std::string what = where + ", option \"" + key + "\"";
    if (key == "maximize") {
      TORCH_CHECK(json_null(value) || !json_bool(value, what), "cpprun: ", what,
                  " is true: the file's optimizer maximised its objective, which LibTorch's SGD, Adam and AdamW "
                  "cannot (they minimise); resuming would step the other way. Train on the negated objective "
                  "with maximize off instead.");
    }
    if (key == "decoupled_weight_decay" && (adam || adamw) && !json_null(value)) {
      const bool decoupled = json_bool(value, what);
      TORCH_CHECK(decoupled == adamw, "cpprun: ", what, " is ", boolean(decoupled), ": the file's update is ",
                  decoupled ? "AdamW's" : "Adam's", ", this optimizer is ", adamw ? "AdamW" : "Adam",
                  ". Build a torch::optim::", decoupled ? "AdamW" : "Adam", " to load it.");
    }
    if (key == "lr") options.set_lr(json_number(value, what));
    const auto adam_like = [&](auto& o) {
      if (key == "betas") {
        TORCH_CHECK(value.kind == Json::Kind::kArray && value.items.size() == 2, "cpprun: ", what, " is not [b1, b2]");
        o.betas({json_number(value.items[0], what, 0, 1, false), json_number(value.items[1], what, 0, 1, false)});
      }
      if (key == "eps") o.eps(json_number(value, what));
      if (key == "weight_decay") o.weight_decay(json_number(value, what));
      if (key == "amsgrad") o.amsgrad(json_bool(value, what));
    };
    if (auto* o = dynamic_cast<torch::optim::AdamWOptions*>(&options)) adam_like(*o);
    if (auto* o = dynamic_cast<torch::optim::AdamOptions*>(&options)) adam_like(*o);
    if (auto* o = dynamic_cast<torch::optim::SGDOptions*>(&options)) {
      if (key == "momentum") o->momentum(json_number(value, what));
      if (key == "dampening") o->dampening(json_number(value, what, -std::numeric_limits<double>::infinity()));
      if (key == "weight_decay") o->weight_decay(json_number(value, what));
      if (key == "nesterov") o->nesterov(json_bool(value, what));
    }
  }
  // The one rule across options torch.optim.SGD's constructor (and LibTorch's) enforces.
  if (auto* o = dynamic_cast<torch::optim::SGDOptions*>(&options)) {
    TORCH_CHECK(!o->nesterov() || (o->momentum() > 0 && o->dampening() == 0), where,
                ": nesterov momentum with momentum ", o->momentum(), " and dampening ", o->dampening(),
                ", which torch.optim.SGD refuses (it needs a momentum above 0 and zero dampening)");
  }
}

// Each optimizer group's parameter names, via the model's parameters.
std::vector<std::vector<std::string>> group_names(const OptimizerParams& params, torch::optim::Optimizer& optimizer,
                                                  const char* call) {
  std::unordered_map<const c10::TensorImpl*, const std::string*> name_of;
  for (std::size_t i = 0; i < params.names.size(); ++i) name_of[params.stepped[i].unsafeGetTensorImpl()] = &params.names[i];
  std::vector<std::vector<std::string>> out;
  for (const auto& group : optimizer.param_groups()) {
    out.emplace_back();
    for (const auto& p : group.params()) {
      const auto found = name_of.find(p.unsafeGetTensorImpl());
      TORCH_CHECK(found != name_of.end(), "cpprun: ", call, ": the optimizer steps a tensor of shape ", p.sizes(),
                  " that is not a parameter of the model (FSDP: build the optimizer from model->parameters(), the "
                  "shards).");
      out.back().push_back(*found->second);
    }
  }
  return out;
}

std::string join(const std::vector<std::string>& items, const std::string& separator) {
  std::string out;
  for (std::size_t i = 0; i < items.size(); ++i) out += (i ? separator : "") + items[i];
  return out;
}

void check_path(const std::string& path, const char* call) {
  TORCH_CHECK(is_sharded_state_dict_path(path) || has_safetensors_extension(path), "cpprun: ", call, "(..., \"", path,
              "\"): an optimizer's state is saved as safetensors: end the path in .safetensors, or in '/' for a "
              "directory (optimizer-0000R-of-0000N.safetensors beside a model's files).");
}

// What rank 0 read, checked for integrity, before it is compared with the optimizer.
struct ReadOptimizerFile {
  NamedTensors tensors;
  std::map<std::string, std::string> metadata;
  std::map<std::string, std::string> file_of;  // a directory's tensor -> its file
};

ReadOptimizerFile read_optimizer_files(const std::string& path, const std::set<std::string>* wanted = nullptr) {
  ReadOptimizerFile out;
  if (!is_sharded_state_dict_path(path)) {
    const std::string bytes = read_state_dict_bytes(path);
    const SafetensorsFile parsed = read_safetensors(bytes, path);
    out.metadata = parsed.metadata;
    out.tensors = decode_safetensors(parsed, path);
    return out;
  }
  const fs::path dir = sharded_directory_of(path, kOptimizerStem);
  TORCH_CHECK(fs::exists(dir / index_file_name(kOptimizerStem)), "cpprun: load_optimizer_state_dict: ", dir.string(),
              " holds no ", index_file_name(kOptimizerStem), ": was the optimizer saved there "
              "(save_optimizer_state_dict(model, optimizer, \"", (dir / "").string(), "\"))?");
  ShardedDirectory read = read_sharded_directory(dir.string(), kOptimizerStem, wanted);
  // One save with the model beside it: its index's id, when both have one.
  const fs::path model_index = dir / index_file_name(kModelStem);
  const auto optimizer_id = read.index.metadata.find(std::string(kSaveIdKey));
  if (fs::exists(model_index) && optimizer_id != read.index.metadata.end()) {
    const SafetensorsIndex model = read_index_file(model_index.string());
    const auto model_id = model.metadata.find(std::string(kSaveIdKey));
    if (model_id != model.metadata.end() && model_id->second != optimizer_id->second) {
      throw CorruptCheckpointError(
          "cpprun: load_optimizer_state_dict: " + read.index_path + " is from another save (save id \"" +
          optimizer_id->second + "\") than the model beside it (" + model_index.string() + ", save id \"" +
          model_id->second + "\"), and nothing was loaded. Save them together (save_state_dict(model, optimizer, "
          "\"" + dir.string() + "/\", options)), or load the checkpoint they were saved with." +
          interrupted_save_note(dir.string()));
    }
  }
  out.metadata = std::move(read.metadata);
  out.tensors = std::move(read.tensors);
  out.file_of = std::move(read.file_of);
  return out;
}

}  // namespace

void check_optimizer_path(const std::string& path, const char* call) { check_path(path, call); }

OptimizerParams optimizer_params(const StateView& view) {
  OptimizerParams out;
  std::vector<std::size_t> entry_of;  // parameter i -> its entry
  std::map<std::size_t, std::size_t> param_of_entry;
  bool placed = false;
  for (std::size_t e = 0; e < view.entries.size(); ++e) {
    const StateEntry& entry = view.entries[e];
    if (!entry.parameter) continue;
    param_of_entry[e] = out.names.size();
    entry_of.push_back(e);
    out.names.push_back(entry.name);
    out.entries.push_back(&entry);
    out.stepped.push_back(entry.local);
    out.full_sizes.push_back(entry.whole_sizes);
    placed = placed || !entry.placement.replicated();
    if (entry.placement.rows && !out.shard_group) out.shard_group = entry.placement.rows->group;
  }
  for (const auto& [name, e] : view.names) {
    const auto param = param_of_entry.find(e);
    if (param != param_of_entry.end() && name != view.entries[e].name) out.aliases[name] = param->second;
  }
  if (placed) {
    const StateView* v = &view;  // outlives the params: both live in the caller's frame
    out.gather = [v, entry_of](std::size_t i, const at::Tensor& local) {
      return gather_whole(v->entries[entry_of[i]], local);
    };
    out.local_part = [v, entry_of](std::size_t i, const at::Tensor& whole) {
      return local_part(v->entries[entry_of[i]], whole);
    };
  }
  return out;
}


OptimizerStateToSave optimizer_state_to_save(const OptimizerParams& params, torch::optim::Optimizer& optimizer,
                                             const std::function<at::Tensor(const at::Tensor&)>& take,
                                             const CheckpointTeam* writers, const std::string& what,
                                             WholeTensors hold, RowsInPlace* in_place) {
  const std::string kind = kind_of(optimizer);
  const auto names = group_names(params, optimizer, "save_optimizer_state_dict");
  // Each parameter's state names, by its group's options.
  std::vector<const torch::optim::OptimizerOptions*> options_of(params.names.size());
  {
    std::map<std::string, std::size_t> index;
    for (std::size_t i = 0; i < params.names.size(); ++i) index[params.names[i]] = i;
    for (std::size_t g = 0; g < names.size(); ++g) {
      for (const auto& name : names[g]) options_of[index[name]] = &optimizer.param_groups()[g].options();
    }
  }
  // Which parameters have state, and their steps. FSDP: a rank with no rows may hold none where
  // the others do; the group agrees (max) so that every rank joins the same gathers.
  const std::size_t n = params.names.size();
  std::vector<std::optional<ParamOptimizerState>> local(n);
  std::vector<int64_t> has(2 * n, 0);  // [has state] * n, then [step] * n
  for (std::size_t i = 0; i < n; ++i) {
    if (!options_of[i]) continue;  // not in the optimizer
    if (params.saved_by_another.count(params.names[i])) continue;  // its state is saved by the owner of its alias
    local[i] = read_optimizer_state(optimizer, params.stepped[i]);
    if (local[i]) {
      has[i] = 1;
      has[n + i] = local[i]->step;
    }
  }
  if (params.gather && params.shard_group && n > 0) {
    at::Tensor agreed = at::tensor(has, at::kLong).to(params.stepped[0].device());
    all_reduce(*params.shard_group, agreed, ReduceOp::kMax);
    agreed = agreed.cpu();
    for (std::size_t i = 0; i < 2 * n; ++i) has[i] = agreed[static_cast<int64_t>(i)].item<int64_t>();
  }
  NamedTensors state;
  // A sharded save's tensors, each gathered only to its writers (checkpoint/writer_gather.h).
  const CheckpointTeam* to_writers = writers && params.entries.size() == n ? writers : nullptr;
  // kOwned promises tensors the optimizer does not hold: only gather_for_writers makes them.
  TORCH_INTERNAL_ASSERT(to_writers || hold == WholeTensors::kMayShare, "an owned optimizer state without writers");
  std::vector<SavePiece> pieces;
  std::vector<std::pair<std::string, std::size_t>> names_of_pieces;
  for (std::size_t i = 0; i < n; ++i) {
    if (has[i] == 0) continue;
    const std::string prefix = "state." + params.names[i] + ".";
    for (const auto& name : state_names(*options_of[i])) {
      at::Tensor t;
      if (local[i]) {
        const auto found = local[i]->tensors.find(name);
        if (found != local[i]->tensors.end()) t = found->second;
      }
      if (!t.defined()) t = at::zeros_like(params.stepped[i]);
      if (to_writers) {
        names_of_pieces.emplace_back(prefix + name, pieces.size());
        pieces.push_back({params.entries[i], t.detach()});
        continue;
      }
      at::Tensor whole = params.gather ? params.gather(i, t.detach()) : t.detach();
      state.emplace_back(prefix + name, take ? take(whole) : std::move(whole));
    }
    if (has_step(kind)) {
      at::Tensor step = at::scalar_tensor(static_cast<double>(has[n + i]), at::kFloat);
      if (to_writers) {
        names_of_pieces.emplace_back(prefix + "step", pieces.size());
        pieces.push_back({nullptr, std::move(step)});  // whole on every rank
        continue;
      }
      state.emplace_back(prefix + "step", take ? take(step) : std::move(step));
    }
  }
  if (to_writers) state = gather_for_writers(pieces, names_of_pieces, *to_writers, what, hold, in_place);
  OptimizerStateToSave out{std::move(state), {{kOptimizerKindKey, kind}}, {}, {}};
  for (std::size_t g = 0; g < names.size(); ++g) {
    out.group_params.emplace_back();
    for (const auto& name : names[g]) {
      if (!params.saved_by_another.count(name)) out.group_params.back().push_back(name);
    }
    out.group_options.push_back(options_json(optimizer.param_groups()[g].options()));
  }
  out.metadata[kParamGroupsKey] = param_groups_json(out.group_params, out.group_options);
  return out;
}

void merge_owned_param_groups(OptimizerStateToSave& saved, const ProcessGroup& owners) {
  // Each owner's groups: OPTIONS \x01 NAME \0 NAME \0 ... per group, the groups ended by \x02.
  std::string mine;
  for (std::size_t g = 0; g < saved.group_params.size(); ++g) {
    mine += saved.group_options[g] + '\x01';
    for (const auto& name : saved.group_params[g]) mine += name + '\0';
    mine += '\x02';
  }
  std::vector<std::vector<std::string>> params;
  std::vector<std::string> options;
  std::vector<int> options_from;  // the owner whose options group g took first
  std::string disagreement;
  const auto parts = all_gather_bytes(owners, mine);
  for (int owner = 0; owner < static_cast<int>(parts.size()); ++owner) {
    const std::string& part = parts[static_cast<std::size_t>(owner)];
    std::size_t at = 0;
    for (std::size_t g = 0; at < part.size(); ++g) {
      const std::size_t options_end = part.find('\x01', at), group_end = part.find('\x02', at);
      const std::string group_options = part.substr(at, options_end - at);
      if (g == params.size()) {
        params.emplace_back();
        options.push_back(group_options);
        options_from.push_back(owner);
      } else if (options[g] != group_options && disagreement.empty()) {
        disagreement = "param group " + std::to_string(g) + " has options {" + options[g].substr(2) +
                       "} on pipeline rank " + std::to_string(options_from[g]) + " but {" + group_options.substr(2) +
                       "} on pipeline rank " + std::to_string(owner);
      }
      for (std::size_t name = options_end + 1; name < group_end;) {
        const std::size_t end = part.find('\0', name);
        params[g].push_back(part.substr(name, end - name));
        name = end + 1;
      }
      at = group_end + 1;
    }
  }
  TORCH_CHECK(disagreement.empty(), "cpprun: save_optimizer_state_dict: the pipeline stages' optimizers differ: ",
              disagreement, ". One checkpoint holds the unsplit model's optimizer, one set of options per group: "
              "build every stage's optimizer with the same groups and options.");
  saved.group_params = std::move(params);
  saved.group_options = std::move(options);
  saved.metadata[kParamGroupsKey] = param_groups_json(saved.group_params, saved.group_options);
}

void save_optimizer_state_dict(const OptimizerParams& params, torch::optim::Optimizer& optimizer,
                               const CheckpointTeam& team, const std::string& path,
                               const StateDictSaveOptions& options) {
  check_path(path, "save_optimizer_state_dict");
  if (is_sharded_state_dict_path(path)) {
    RowsInPlace in_place;  // See Note [Each rank writes its own rows]
    const OptimizerStateToSave saved = optimizer_state_to_save(
        params, optimizer, nullptr, &team, "saving the optimizer state to " + path, WholeTensors::kMayShare, &in_place);
    save_sharded_tensors(saved.state, team, path, options, kOptimizerStem, saved.metadata, &in_place);
    return;
  }
  OptimizerStateToSave saved = optimizer_state_to_save(params, optimizer);
  std::exception_ptr failure;
  if (team.is_root()) {
    try {
      write_state_dict_file(saved.state, path, options, saved.metadata);
    } catch (...) {
      failure = std::current_exception();
    }
  }
  team.agree(failure, "saving the optimizer state to " + path);
}

namespace {

// A flat state key, "state.<name>.<what>" (PyTorch's flattened optimizer state dict): the
// parameter's name as the key spells it (empty when the key is not of that form) and what it holds.
struct StateKey {
  std::string name;
  std::string what;
};
StateKey split_state_key(const std::string& key) {
  const std::size_t dot = key.rfind('.');
  StateKey out;
  if (dot == std::string::npos) return out;
  out.what = key.substr(dot + 1);
  if (key.rfind("state.", 0) == 0 && dot > 6) out.name = key.substr(6, dot - 6);
  return out;
}

// An optimizer's file as every rank of the team has it: what the root read, of one save.
struct OptimizerFile {
  std::string path;
  NamedTensors tensors;
  std::map<std::string, std::string> metadata;
  std::map<std::string, std::string> file_of;  // a directory's tensor -> its file, for messages
  std::set<std::string> held_elsewhere;         // parameters the other owners load
  std::string noun = "the file";                // what the faults call it ("the state dict")
  // State tensors this rank read as its part already (FSDP's rows, read alone from the files:
  // read_directory_for_team), its own; their `tensors` are descriptions (meta device).
  std::map<std::string, at::Tensor> local = {};
  // Its tensors were made by this load and nothing else holds them (a directory's, read from the
  // files): the state may take them as they are, where a dict's are the caller's.
  bool owned = false;
};

// What rank 0 has to share: read from files, or (set_optimizer_state_dict) made from a dict.
// `wanted`: with owners, the state names this owner holds (a reader may read only those).
using ReadOnRoot = std::function<ReadOptimizerFile(const std::set<std::string>* wanted)>;

// The lines of `text`, each ended by '\n' (the last may lack it).
std::set<std::string> lines_of(const std::string& text) {
  std::set<std::string> lines;
  for (std::size_t at = 0, end; at < text.size(); at = end + 1) {
    end = std::min(text.find('\n', at), text.size());
    lines.insert(text.substr(at, end - at));
  }
  return lines;
}

// What read_for_team's receivers need besides the tensors' bytes, as JSON: {"metadata": {key:
// value}, "file_of": {name: file}, "held_elsewhere": [name], "tensors": [[name, dtype, [sizes]]]},
// the dtype as c10::ScalarType's number (every rank runs the same build).
// `map` as a JSON object of strings, appended to `out`.
void append_json_object(std::string& out, const std::map<std::string, std::string>& map) {
  const char* sep = "{";
  for (const auto& [key, value] : map) {
    out += sep;
    append_json_string(out, key);
    out += ':';
    append_json_string(out, value);
    sep = ",";
  }
  out += map.empty() ? "{}" : "}";
}

std::string encode_layout(const OptimizerFile& file) {
  std::string out = "{\"metadata\":";
  append_json_object(out, file.metadata);
  out += ",\"file_of\":";
  append_json_object(out, file.file_of);
  out += ",\"held_elsewhere\":[";
  const char* sep = "";
  for (const auto& name : file.held_elsewhere) {
    out += sep;
    append_json_string(out, name);
    sep = ",";
  }
  out += "],\"tensors\":[";
  sep = "";
  for (const auto& [name, tensor] : file.tensors) {
    out += sep;
    out += '[';
    append_json_string(out, name);
    out += ',' + std::to_string(static_cast<int>(tensor.scalar_type())) + ",[";
    for (int64_t d = 0; d < tensor.dim(); ++d) out += (d ? "," : "") + std::to_string(tensor.size(d));
    out += "]]";
    sep = ",";
  }
  out += "]}";
  return out;
}

// The receiving side of encode_layout: `file` gets the metadata and names, and each tensor
// allocated (on the CPU, as the root holds them) for the broadcast to fill.
void decode_layout(const std::string& text, OptimizerFile& file) {
  const Json root = parse_json(text, 4);
  for (const auto& [part, value] : root.members) {
    if (part == "metadata") {
      for (const auto& [key, item] : value.members) file.metadata[key] = item.text;
    } else if (part == "file_of") {
      for (const auto& [key, item] : value.members) file.file_of[key] = item.text;
    } else if (part == "held_elsewhere") {
      for (const auto& item : value.items) file.held_elsewhere.insert(item.text);
    } else if (part == "tensors") {
      for (const auto& item : value.items) {
        std::vector<int64_t> sizes;
        for (const auto& size : item.items[2].items) sizes.push_back(std::stoll(size.text));
        const auto dtype = static_cast<at::ScalarType>(std::stoi(item.items[1].text));
        file.tensors.emplace_back(item.items[0].text, at::empty(sizes, at::TensorOptions().dtype(dtype)));
      }
    }
  }
}

// The root reads and checks the files (or makes its state from what `read_on_root` gives); every
// rank gets the same tensors, names and metadata. A failure to read travels as its message, so
// every rank raises the same error.
// With `owners`, each owner's root reads only the files holding its parameters' state, and the
// roots share their parameters' names, and any failure, before their teams see the bytes (a
// condition on team.is_root() is the same across an owners group: Note [Teams and owners] in
// owned_state.cpp).
// Note [The load's broadcast]: the root keeps the tensors it decoded and sends its team their
// names, dtypes, shapes and the metadata first, then the tensors themselves, each straight from
// the root's memory into one the receiver allocated (broadcast_coalesced). Encoding them into one
// safetensors buffer for the team, as this did, cost the root a copy and a CRC pass over the
// whole state, and each receiver a CRC pass and a copy out of it: 400 MB of AdamW state took 4 s to
// load at 2 ranks, half of it in that broadcast. The files' CRCs are checked as the root reads them;
// between the job's own ranks the end-to-end CRC is left out on purpose (the transport's own checks
// remain: TCP's checksum over loopback or the network, NVLink's or InfiniBand's CRCs under NCCL).
OptimizerFile read_for_team(const OptimizerParams& params, const CheckpointTeam& team, const std::string& path,
                            const ProcessGroup* owners, const ReadOnRoot& read_on_root) {
  OptimizerFile out{path, {}, {}, {}, {}};
  std::string verdict;  // empty: the root has the state; else its failure, or another owner's, described
  std::string layout;   // the root's tensors' names, dtypes and shapes, and the metadata (JSON)
  std::exception_ptr failure;
  if (team.is_root()) {
    std::set<std::string> held(params.names.begin(), params.names.end());
    for (const auto& [alias, index] : params.aliases) held.insert(alias);
    std::set<std::string> wanted;
    for (const auto& name : held) {
      for (const char* what : kStateNames) wanted.insert("state." + name + "." + what);
    }
    ReadOptimizerFile read;
    try {
      read = read_on_root(owners ? &wanted : nullptr);
    } catch (...) {
      failure = std::current_exception();
      verdict = describe_failure(failure);
    }
    std::string elsewhere;
    if (owners) {
      std::string mine = failure ? "F" + verdict : "N";
      for (const auto& name : held) mine += name + '\n';
      const auto parts = all_gather_bytes(*owners, mine);
      for (int owner = 0; owner < static_cast<int>(parts.size()); ++owner) {
        const std::string& part = parts[static_cast<std::size_t>(owner)];
        if (part[0] == 'F' && verdict.empty()) verdict = part.substr(1);  // the first failure, on every root
        if (owner != owners->rank() && part[0] == 'N') elsewhere += part.substr(1);
      }
    }
    if (verdict.empty()) {
      try {
        for (auto& [name, tensor] : read.tensors) tensor = tensor.detach().to(at::kCPU).contiguous();
        out.tensors = std::move(read.tensors);
        out.metadata = std::move(read.metadata);
        out.file_of = std::move(read.file_of);
        out.held_elsewhere = lines_of(elsewhere);
        if (!team.alone()) layout = encode_layout(out);
      } catch (...) {
        failure = std::current_exception();
        verdict = describe_failure(failure);
      }
    }
  }
  team.broadcast_bytes(verdict);
  if (failure) std::rethrow_exception(failure);
  if (!verdict.empty()) throw_described_failure(verdict);
  if (team.alone()) return out;
  team.broadcast_bytes(layout);
  // A receiver that cannot hold the state (out of memory) says so before the root sends it, so
  // that no rank is left inside the broadcast.
  std::exception_ptr unmade;
  if (!team.is_root()) {
    try {
      decode_layout(layout, out);
    } catch (...) {
      unmade = std::current_exception();
    }
  }
  team.agree(unmade, "making room for the optimizer state rank 0 read from " + path);
  std::vector<at::Tensor> tensors;
  for (const auto& [name, tensor] : out.tensors) tensors.push_back(tensor);
  team.broadcast_tensors(tensors);
  return out;
}

// read_for_team for a directory, read on every rank of the team in parallel (Note [Reading a
// directory on every rank] in parallel_load.cpp): the root finds the optimizer's index (and checks
// its save id against the model's index beside it), every writer reads its share of the files, the
// team agrees that they hold together, and then each rank reads from the files what it keeps (Note
// [Each rank reads its own part] in part_read.cpp): its rows of the state of a parameter FSDP
// shards by rows (OptimizerFile::local), every other tensor whole (steps, other placements; each
// rank keeps its part when they are applied). The faults are then decided on every rank alike
// from the tensors' names, dtypes and shapes, as for a file.
OptimizerFile read_directory_for_team(const OptimizerParams& params, const CheckpointTeam& team, const std::string& path) {
  std::string found;  // the directory, '\0', the index's text
  std::exception_ptr failure;
  if (team.is_root()) {
    try {
      const fs::path dir = sharded_directory_of(path, kOptimizerStem);
      const fs::path index_path = dir / index_file_name(kOptimizerStem);
      TORCH_CHECK(fs::exists(index_path), "cpprun: load_optimizer_state_dict: ", dir.string(), " holds no ",
                  index_file_name(kOptimizerStem), ": was the optimizer saved there "
                  "(save_optimizer_state_dict(model, optimizer, \"", (dir / "").string(), "\"))?");
      std::string text = read_index_text(index_path.string());
      const SafetensorsIndex index = read_safetensors_index(text, index_path.string());
      // One save with the model beside it: its index's id, when both have one.
      const fs::path model_index = dir / index_file_name(kModelStem);
      const auto optimizer_id = index.metadata.find(std::string(kSaveIdKey));
      if (fs::exists(model_index) && optimizer_id != index.metadata.end()) {
        const SafetensorsIndex model = read_index_file(model_index.string());
        const auto model_id = model.metadata.find(std::string(kSaveIdKey));
        if (model_id != model.metadata.end() && model_id->second != optimizer_id->second) {
          throw CorruptCheckpointError(
              "cpprun: load_optimizer_state_dict: " + index_path.string() + " is from another save (save id \"" +
              optimizer_id->second + "\") than the model beside it (" + model_index.string() + ", save id \"" +
              model_id->second + "\"), and nothing was loaded. Save them together (save_state_dict(model, optimizer, "
              "\"" + dir.string() + "/\", options)), or load the checkpoint they were saved with." +
              interrupted_save_note(dir.string()));
        }
      }
      found = fs::absolute(dir).lexically_normal().string() + '\0' + text;  // one path on every rank
    } catch (...) {
      failure = std::current_exception();
    }
  }
  team.share_root_failure(failure);
  team.broadcast_bytes(found);
  const std::size_t nul = found.find('\0');
  TORCH_INTERNAL_ASSERT(nul != std::string::npos, "the optimizer's directory arrived garbled");
  TeamDirectoryRead read = read_directory_on_writers(team, found.substr(0, nul), kOptimizerStem,
                                                     found.substr(nul + 1), nullptr);
  OptimizerFile out{path, {}, {}, {}, {}};
  out.owned = true;  // every tensor is read below into one this load allocates
  if (read.files.empty()) {
    // No file (an optimizer saved before its first step): the index carries every file's stamp.
    out.metadata = read.index.metadata;
    out.metadata.erase("total_size");
  } else {
    out.metadata = read.info_of.at(read.files.front())->metadata;
  }
  // Every rank makes room for what it reads before any is read, and the team agrees on it.
  std::map<std::string, std::size_t> index_of;  // the model's names, a tied parameter's each
  for (std::size_t i = 0; i < params.names.size(); ++i) index_of[params.names[i]] = i;
  for (const auto& [alias, i] : params.aliases) index_of[alias] = i;
  // The entry of the parameter FSDP shards by rows whose whole state `t` is (nullptr: none).
  const auto rows_of = [&](const ReadTensorInfo& t) -> const StateEntry* {
    const StateKey key = split_state_key(t.name);
    if (key.name.empty() || key.what == "step") return nullptr;
    const auto found = index_of.find(key.name);
    if (found == index_of.end() || found->second >= params.entries.size() || !params.entries[found->second] ||
        t.sizes != params.full_sizes[found->second]) {
      return nullptr;  // not a parameter's state of its shape: read whole, and refused later
    }
    const StateEntry* entry = params.entries[found->second];
    return entry->placement.rows && !entry->placement.tensor_parallel ? entry : nullptr;
  };
  struct Read {
    std::string path;
    const FileIdentity* checked;  // the file as its reader checked it
    FilePart part;
    at::Tensor into;
  };
  std::vector<Read> reads;
  failure = nullptr;  // the root's, already shared: none
  try {
    for (const auto& file : read.files) {
      const std::string file_path = (fs::path(read.dir) / file).string();
      const FileIdentity* checked = &read.info_of.at(file)->identity;
      check_unchanged(file_path, *checked);
      for (const auto& t : read.info_of.at(file)->tensors) {
        out.file_of[t.name] = file;
        const auto options = at::TensorOptions().dtype(t.dtype);
        if (const StateEntry* entry = rows_of(t)) {
          const FilePart part = own_part(*entry, t.offset, t.dtype);
          out.tensors.emplace_back(t.name, at::empty(t.sizes, options.device(at::kMeta)));
          out.local[t.name] = at::empty(entry->placement.rows->local_sizes, options);
          reads.push_back({file_path, checked, part, out.local[t.name]});
          continue;
        }
        at::Tensor whole = at::empty(t.sizes, options);
        out.tensors.emplace_back(t.name, whole);
        reads.push_back({file_path, checked, FilePart{t.offset, whole.numel()}, whole});
      }
    }
  } catch (...) {
    failure = std::current_exception();
  }
  team.agree(failure, "making room for the optimizer state read from " + path +
                          " (and finding its files as they were checked)");
  try {
    for (const Read& r : reads) read_part(r.path, *r.checked, r.part, r.into);
  } catch (...) {
    failure = std::current_exception();
  }
  team.agree(failure, "reading the optimizer state from " + path);
  return out;
}

// What a load applies once the file is found to fit: the file's param groups, each of our
// parameters' group there, and each parameter's state tensors by name ("exp_avg", "step").
struct OptimizerLoad {
  Json groups;
  std::map<std::string, std::size_t> group_of;
  std::map<std::string, std::map<std::string, at::Tensor>> state_of;
  std::map<std::string, std::set<std::string>> already_local;  // name -> its states read as this rank's part
  bool owned = false;  // the file's tensors are this load's alone (OptimizerFile::owned)
};

// Every way `file` does not fit `optimizer` over `params` (empty: it fits), and in `load` what
// to apply when it does.
std::vector<std::string> optimizer_file_faults(const OptimizerParams& params, torch::optim::Optimizer& optimizer,
                                               const std::string& kind,
                                               const std::vector<std::vector<std::string>>& names,
                                               const OptimizerFile& file, OptimizerLoad& load) {
  load.owned = file.owned;
  const auto in_file = [&](const std::string& name) {
    const auto found = file.file_of.find(name);
    return found == file.file_of.end() ? std::string() : " (in " + found->second + ")";
  };
  std::vector<std::string> faults;
  const auto meta = [&](const char* key) {
    const auto found = file.metadata.find(key);
    return found == file.metadata.end() ? std::string() : found->second;
  };
  const std::string file_kind = meta(kOptimizerKindKey);
  if (file_kind.empty()) {
    faults.push_back(file.noun + " has no \"" + std::string(kOptimizerKindKey) + "\" in its metadata: it is not an "
                     "optimizer's state saved by save_optimizer_state_dict (a model's state dict?)");
  } else if (file_kind != kind) {
    faults.push_back(file.noun + " holds " + file_kind + "'s state; this optimizer is " + kind);
  }
  Json& groups = load.groups;
  const std::string groups_text = meta(kParamGroupsKey);
  try {
    // Each parameter named once (ours and, in a pipeline stage's load, the other stages'), and a few
    // dozen options a group, at most a group a parameter: a 20 MB list of 10 million zeros once
    // took 1.4 GB to parse before it was refused.
    const std::size_t max_values = 32 * (params.names.size() + file.held_elsewhere.size() + 1) + 1024;
    groups = parse_json(groups_text.empty() ? "[]" : groups_text, kMaxGroupsDepth, max_values);
  } catch (const JsonSyntaxError& e) {
    faults.push_back(std::string("its \"") + kParamGroupsKey + "\" is not valid JSON: " + e.what());
  }
  std::map<std::string, std::size_t> index_of;  // the model's names
  for (std::size_t i = 0; i < params.names.size(); ++i) index_of[params.names[i]] = i;
  // A tied parameter's other name -> its first (see OptimizerParams::aliases).
  const auto canonical = [&](const std::string& name) {
    const auto alias = params.aliases.find(name);
    return alias == params.aliases.end() ? name : params.names[alias->second];
  };
  std::map<std::string, std::size_t>& group_of = load.group_of;  // the file's names -> their group
  if (groups.kind != Json::Kind::kArray) {
    if (faults.empty()) faults.push_back(std::string("its \"") + kParamGroupsKey + "\" is not a JSON array");
  } else {
    std::set<std::string> ours, theirs;
    for (const auto& list : names) ours.insert(list.begin(), list.end());
    for (std::size_t g = 0; g < groups.items.size(); ++g) {
      for (const auto& [key, value] : groups.items[g].members) {
        if (key != "params") continue;
        for (const auto& item : value.items) {
          const std::string name = canonical(item.text);
          if (!ours.count(name) && file.held_elsewhere.count(item.text)) continue;  // another owner's
          if (!theirs.insert(name).second) {
            faults.push_back("the param groups name \"" + name + "\" twice" +
                             (name == item.text ? std::string() : ", once as \"" + item.text + "\" (a tied parameter: "
                                                  "one tensor, its state saved under one name)"));
          }
          group_of[name] = g;
        }
      }
    }
    std::vector<std::string> missing, unexpected;
    for (const auto& name : ours) if (!theirs.count(name)) missing.push_back(name);
    for (const auto& name : theirs) if (!ours.count(name)) unexpected.push_back(name);
    if (!missing.empty()) {
      faults.push_back("parameters missing from " + file.noun + " (" + std::to_string(missing.size()) + "): " + join(missing, ", "));
    }
    if (!unexpected.empty()) {
      faults.push_back("parameters in " + file.noun + " but not in the model (" + std::to_string(unexpected.size()) +
                       "): " + join(unexpected, ", "));
    }
    if (missing.empty() && unexpected.empty()) {
      if (groups.items.size() != names.size()) {
        faults.push_back(file.noun + " has " + std::to_string(groups.items.size()) + " param group(s), the optimizer " +
                         std::to_string(names.size()));
      } else {
        for (std::size_t g = 0; g < names.size(); ++g) {
          for (const auto& name : names[g]) {
            if (group_of[name] != g) {
              faults.push_back("\"" + name + "\" is in param group " + std::to_string(group_of[name]) +
                               " in " + file.noun + ", " + std::to_string(g) + " here");
            }
          }
        }
      }
    }
  }
  // The state tensors: "state.<name>.<what>", of the parameter's whole shape (step: 0-d).
  auto& state_of = load.state_of;
  for (const auto& [key, tensor] : file.tensors) {
    const StateKey parts = split_state_key(key);
    const std::string name = canonical(parts.name);
    const std::string& what = parts.what;
    const auto found = index_of.find(name);
    if (found == index_of.end() && file.held_elsewhere.count(name)) continue;  // another owner's
    if (found == index_of.end()) {
      faults.push_back("\"" + key + "\"" + in_file(key) + " names no parameter of the model");
      continue;
    }
    const std::size_t i = found->second;
    const std::vector<int64_t> expected = what == "step" ? std::vector<int64_t>{} : params.full_sizes[i];
    if (tensor.sizes().vec() != expected) {
      faults.push_back("\"" + key + "\"" + in_file(key) + " has shape " + c10::str(tensor.sizes()) +
                       ", the model's parameter " + c10::str(c10::IntArrayRef(expected)));
      continue;
    }
    const auto local = file.local.find(key);
    if (local != file.local.end()) load.already_local[name].insert(what);
    if (!state_of[name].emplace(what, local != file.local.end() ? local->second : tensor).second) {
      faults.push_back("\"" + key + "\"" + in_file(key) + ": the tied parameter \"" + name + "\"'s " + what +
                       " is in " + file.noun + " under two names");
    }
  }
  // Each state tensor a value the optimizer can step from: a step a finite count, the rest
  // floating point (the optimizer casts them to the parameter's dtype, which would turn an integer
  // tensor's values into moments nobody saved).
  for (const auto& [name, states] : state_of) {
    for (const auto& [what, tensor] : states) {
      const std::string key = "\"state." + name + "." + what + "\"" + in_file("state." + name + "." + what);
      if (what == "step") {
        // A real number (PyTorch saves float32, older files int64), a whole count: LibTorch's
        // optimizers keep it as an int64, so 2.5 could only be rounded, and a complex or bool
        // step is no count at all.
        const auto type = tensor.scalar_type();
        if (at::isComplexType(type) || type == at::kBool) {
          faults.push_back(key + " is " + std::string(c10::toString(type)) + ", not a count of steps taken");
          continue;
        }
        const double step = tensor.to(at::kDouble).item<double>();
        if (!std::isfinite(step) || step < 0 || step > 9.0e15 || step != std::floor(step)) {
          faults.push_back(key + " is " + c10::str(step) + ", not a count of steps taken");
        }
      } else if (!at::isFloatingType(tensor.scalar_type())) {
        faults.push_back(key + " is " + std::string(c10::toString(tensor.scalar_type())) +
                         ", not a floating-point optimizer state");
      }
    }
  }
  // The groups' options, tried on copies: a value torch.optim's constructor would refuse is a fault
  // here, before anything is applied. The copies then say which state each group keeps: the file's
  // options win, as in torch.optim's load_state_dict (a file saved with amsgrad has max_exp_avg_sq).
  std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> loaded(names.size());
  if (groups.kind == Json::Kind::kArray && faults.empty()) {
    for (std::size_t g = 0; g < names.size(); ++g) {
      if (names[g].empty() || !group_of.count(names[g].front())) continue;
      auto trial = optimizer.param_groups()[g].options().clone();
      try {
        apply_options(*trial, groups.items[group_of.at(names[g].front())], "param group " + std::to_string(g));
        loaded[g] = std::move(trial);
      } catch (const c10::Error& e) {
        faults.push_back(e.what_without_backtrace());
      }
    }
  }
  // A parameter with state has all of it (by its group's options as loaded).
  for (std::size_t g = 0; g < names.size() && faults.empty(); ++g) {
    auto expected = state_names(loaded[g] ? *loaded[g] : optimizer.param_groups()[g].options());
    if (has_step(kind)) expected.push_back("step");
    for (const auto& name : names[g]) {
      const auto found = state_of.find(name);
      if (found == state_of.end()) continue;  // never stepped
      for (const auto& what : expected) {
        if (!found->second.count(what)) faults.push_back("\"state." + name + "." + what + "\" is missing");
      }
      for (const auto& [what, tensor] : found->second) {
        if (std::find(expected.begin(), expected.end(), what) == expected.end()) {
          faults.push_back("\"state." + name + "." + what + "\" is not " + kind + "'s state");
        }
      }
    }
  }
  return faults;
}

// The groups' options, then each parameter's state (this rank's part of it); a parameter the
// file has no state for has none after.
void apply_optimizer_load(const OptimizerParams& params, torch::optim::Optimizer& optimizer,
                          const std::vector<std::vector<std::string>>& names, const OptimizerLoad& load,
                          const std::string& path) {
  for (std::size_t g = 0; g < names.size(); ++g) {
    if (names[g].empty()) continue;
    apply_options(optimizer.param_groups()[g].options(), load.groups.items[load.group_of.at(names[g].front())], path);
  }
  std::map<std::string, std::size_t> index_of;
  for (std::size_t i = 0; i < params.names.size(); ++i) index_of[params.names[i]] = i;
  at::NoGradGuard no_grad;
  for (const auto& group : names) {
    for (const auto& name : group) {
      const std::size_t i = index_of.at(name);
      const at::Tensor& param = params.stepped[i];
      const auto found = load.state_of.find(name);
      if (found == load.state_of.end()) {
        clear_optimizer_state(optimizer, param);
        continue;
      }
      ParamOptimizerState state;
      for (const auto& [what, tensor] : found->second) {
        if (what == "step") {
          state.step = std::llround(tensor.item<double>());
          continue;
        }
        const auto local = load.already_local.find(name);
        const bool already = local != load.already_local.end() && local->second.count(what);
        at::Tensor mine = params.local_part && !already ? params.local_part(i, tensor) : tensor;
        const at::Tensor moved = mine.to(param.device(), param.scalar_type()).contiguous();
        // Taken as it is where nothing else holds it: a copy the move made, rows this load read
        // alone, a whole tensor this load read (uncut); a view of the file's tensors, or a tensor
        // of the caller's dict, is copied (keeping a cut's whole alive would hold the whole state).
        const bool own = !moved.is_alias_of(tensor) || already || (load.owned && !params.local_part);
        state.tensors[what] = own ? moved : moved.clone();
      }
      write_optimizer_state(optimizer, param, state);
    }
  }
}

}  // namespace

void check_optimizer_params(const OptimizerParams& params, torch::optim::Optimizer& optimizer, const char* call) {
  (void)kind_of(optimizer);  // an optimizer whose state cpprun cannot name, refused with the others
  (void)group_names(params, optimizer, call);
}

void load_optimizer_state_dict(const OptimizerParams& params, torch::optim::Optimizer& optimizer,
                               const CheckpointTeam& team, const std::string& path, const ProcessGroup* owners) {
  check_path(path, "load_optimizer_state_dict");
  const std::string kind = kind_of(optimizer);
  const auto names = group_names(params, optimizer, "load_optimizer_state_dict");
  // A directory is read on every rank (but a pipeline's owners' load, which reads by stage).
  const bool in_parallel = !owners && !team.alone() && is_sharded_state_dict_path(path);
  const OptimizerFile file = in_parallel ? read_directory_for_team(params, team, path)
                                         : read_for_team(params, team, path, owners, [&](const std::set<std::string>* wanted) {
                                             return read_optimizer_files(path, wanted);
                                           });
  // Every difference, then one error; every rank decides alike on the same bytes (with owners: on
  // every owner's faults, each rank having its own team's).
  OptimizerLoad load;
  std::vector<std::string> faults = optimizer_file_faults(params, optimizer, kind, names, file, load);
  if (owners) {
    const auto parts = all_gather_bytes(*owners, join(faults, std::string(1, '\0')));
    faults.clear();
    for (int owner = 0; owner < static_cast<int>(parts.size()); ++owner) {
      const std::string& part = parts[static_cast<std::size_t>(owner)];
      for (std::size_t at = 0, end; at < part.size(); at = end + 1) {
        end = std::min(part.find('\0', at), part.size());
        faults.push_back("pipeline rank " + std::to_string(owner) + ": " + part.substr(at, end - at));
      }
    }
  }
  if (!faults.empty()) {
    throw StateDictMismatchError("cpprun: load_optimizer_state_dict refused " + path + " (" +
                                 std::to_string(faults.size()) + " fault(s)), and nothing was loaded:\n  " +
                                 join(faults, "\n  ") + "\nWas it saved from another model or optimizer?");
  }
  apply_optimizer_load(params, optimizer, names, load, path);
}

FlatOptimizerState get_optimizer_state(const OptimizerParams& params, torch::optim::Optimizer& optimizer,
                                       const CheckpointTeam& team, const StateDictOptions& options) {
  TORCH_CHECK(options.file_key_prefix().empty() && options.consume_prefix_in_state_dict_if_present().empty(),
              "cpprun: get_optimizer_state_dict gives the model's own names; file_key_prefix and "
              "consume_prefix_in_state_dict_if_present apply to a model's loads (set_model_state_dict, "
              "load_state_dict): leave them empty here.");
  // Under cpu_offload a gathered tensor lives on the device only until it is copied to the CPU (the
  // root) or dropped (the others), as PyTorch's _gather_state_dict with ranks_only=(0,) does.
  const bool keep = !options.cpu_offload() || team.is_root();
  OptimizerStateToSave saved = optimizer_state_to_save(params, optimizer, [&](const at::Tensor& tensor) {
    if (!keep) return at::Tensor();
    return options.cpu_offload() ? tensor.to(at::kCPU) : tensor;
  });  // collective: every rank gathers
  if (!keep) return FlatOptimizerState();
  return flatten_optimizer_state(std::move(saved.state), saved.metadata.at(kParamGroupsKey));
}

void set_optimizer_state(const OptimizerParams& params, torch::optim::Optimizer& optimizer, const CheckpointTeam& team,
                         const FlatOptimizerState& state, const StateDictOptions& options) {
  TORCH_CHECK(options.file_key_prefix().empty() && options.consume_prefix_in_state_dict_if_present().empty(),
              "cpprun: set_optimizer_state_dict takes the model's own names (as get_optimizer_state_dict gives "
              "them); file_key_prefix and consume_prefix_in_state_dict_if_present apply to a model's loads: leave "
              "them empty here.");
  const std::string kind = kind_of(optimizer);
  const auto names = group_names(params, optimizer, "set_optimizer_state_dict");
  std::map<std::string, std::string> canonical;
  for (const auto& [alias, index] : params.aliases) canonical[alias] = params.names[index];
  const std::string source = "the state dict given to set_optimizer_state_dict";
  // The dict as the file a save would have written, with what could not be made into one.
  const auto as_file = [&](const std::set<std::string>*) {
    UnflattenedOptimizerState made = unflatten_optimizer_state(state, names, canonical, kind);
    ReadOptimizerFile out;
    out.tensors = std::move(made.tensors);
    out.metadata = {{kOptimizerKindKey, made.kind}, {kParamGroupsKey, made.param_groups_json},
                    {kDictFaultsKey, join(made.faults, "\n")}};
    return out;
  };
  OptimizerFile file;
  std::vector<std::string> faults;
  OptimizerLoad load;
  std::exception_ptr failure;
  const auto take_unmade = [&] {
    file.noun = "the state dict";
    const std::string unmade = file.metadata[kDictFaultsKey];
    file.metadata.erase(kDictFaultsKey);
    for (std::size_t at = 0, end; at < unmade.size(); at = end + 1) {
      end = std::min(unmade.find('\n', at), unmade.size());
      faults.push_back(unmade.substr(at, end - at));
    }
  };
  if (options.broadcast_from_rank0()) {
    file = read_for_team(params, team, source, nullptr, as_file);  // the root's dict, on every rank
    take_unmade();
  }
  try {
    // Each rank its own dict: made into a file inside the try, so that a value that cannot be
    // read (an undefined tensor) reaches the agreement below rather than leave the others waiting.
    if (!options.broadcast_from_rank0()) {
      ReadOptimizerFile made = as_file(nullptr);
      file = OptimizerFile{source, std::move(made.tensors), std::move(made.metadata), {}, {}};
      take_unmade();
    }
    for (auto& fault : optimizer_file_faults(params, optimizer, kind, names, file, load)) faults.push_back(fault);
    if (!faults.empty()) {
      throw StateDictMismatchError("cpprun: set_optimizer_state_dict refused the state dict given (" +
                                   std::to_string(faults.size()) + " fault(s)), and nothing was changed:\n  " +
                                   join(faults, "\n  ") + "\nWas it got from another model or optimizer?");
    }
  } catch (...) {
    failure = std::current_exception();
  }
  if (options.broadcast_from_rank0()) {
    if (failure) std::rethrow_exception(failure);  // every rank decided alike, on the root's bytes
  } else {
    // Every rank its own dict: all check before any applies, so that one rank's fault leaves every
    // rank's optimizer as it was, as set_model_state_dict.
    team.agree(failure, "set_optimizer_state_dict");
  }
  apply_optimizer_load(params, optimizer, names, load, source);
}

}  // namespace cpprun::detail

