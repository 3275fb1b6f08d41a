// The entry points of cpprun/state_dict.h and cpprun/optimizer_state_dict.h, once for every
// wrapper and for a plain module: the source describes its state (checkpoint/state_view.h); the
// whole tensors are gathered by placement and written over the view's team, or read, broadcast
// and cut back to each rank's part (a sharded directory: read on every rank, checkpoint/
// parallel_load.h). Nothing here knows which wrapper it saves.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <map>
#include <string>
#include <system_error>
#include <utility>

#include "checkpoint/state_view.h"
#include "comm/public_call.h"
#include "checkpoint/async_optimizer_save.h"
#include "checkpoint/async_save.h"
#include "checkpoint/optimizer_state_dict.h"
#include "checkpoint/rows_in_place.h"
#include "checkpoint/save_files.h"
#include "checkpoint/parallel_load.h"
#include "checkpoint/sharded_state_dict.h"
#include "checkpoint/state_dict.h"
#include "checkpoint/writer_gather.h"
#include "cpprun/optimizer_state_dict.h"
#include "cpprun/checkpoint_file.h"
#include "cpprun/detail/replaced_files.h"
#include "cpprun/state_dict.h"
#include "support/safetensors.h"
#include "support/safetensors_index.h"

namespace cpprun::detail {
namespace {

// A model's part of an asynchronous save to PATH, copied before the call returns: a directory's
// by its writers (FSDP's rows by every rank, each its own: `rows`), a file's whole on every rank.
AsyncSavePart model_part(const StateView& view, const std::string& path) {
  AsyncSavePart part;
  part.path = path;
  part.owned = is_sharded_state_dict_path(path);
  part.state = state_to_save(view, path, WholeTensors::kOwned, &part.rows);
  return part;
}

}  // namespace

void save_model_state(StateSource source, const std::string& path, const StateDictSaveOptions& options) {
  PublicCallScope call("cpprun::save_state_dict");
  check_state_dict_path(path);  // before any collective: every rank refuses alike
  const StateView view = state_view(source);
  at::NoGradGuard no_grad;
  if (is_sharded_state_dict_path(path)) {
    // FSDP's rows written in place by each rank (Note [Each rank writes its own rows]); what a
    // writer holds whole, gathered to it alone (Note [Gathering to the writer]).
    RowsInPlace in_place;
    const NamedTensors state = state_to_save(view, path, WholeTensors::kMayShare, &in_place);
    save_sharded_tensors(state, view.team, path, options, kModelStem, {}, &in_place);
    return;
  }
  save_state_dict(whole_state(view), view.team, path, options);
}

namespace {

// Who says what a strict(false) load left as it was: the team's first rank; a plain module's team
// is each rank alone, so only the job's rank 0 of those (one line, not one a rank).
bool first_to_warn(const CheckpointTeam& team) { return team.is_root() && (!team.alone() || cpprun::rank() == 0); }

}  // namespace

StateDictLoadReport load_model_state(StateSource source, const std::string& path, const StateDictOptions& options) {
  PublicCallScope call("cpprun::load_state_dict");
  const StateView view = state_view(source);
  at::NoGradGuard no_grad;
  // A directory's files are read on every rank, each tensor sent to where it is needed
  // (Note [Reading a directory on every rank]); a directory holding one file loads it as below.
  if (!view.team.alone() && is_sharded_state_dict_path(path)) {
    if (auto report = load_directory_in_parallel(view, path, options)) {
      warn_left_as_they_were(*report, path, first_to_warn(view.team));
      return *std::move(report);
    }
  }
  // The current whole state: what the file's tensors replace, and what a strict(false) load
  // leaves where the file has nothing (a replicated tensor is the module's own: loaded in place).
  const NamedTensors whole = whole_state(view);
  StateDictLoadReport report = load_state_dict(whole, view.team, path, options);
  scatter_whole_state(view, whole);
  warn_left_as_they_were(report, path, first_to_warn(view.team));
  return report;
}

AsyncSave save_model_state_async(StateSource source, const std::string& path, const StateDictSaveOptions& options) {
  PublicCallScope call("cpprun::save_async");
  check_state_dict_path(path);
  const StateView view = state_view(source);
  at::NoGradGuard no_grad;
  std::vector<AsyncSavePart> parts;
  parts.push_back(model_part(view, path));
  return start_async_save(std::move(parts), view.team, options);  // copied before it returns
}

torch::OrderedDict<std::string, at::Tensor> get_model_state(StateSource source, const StateDictOptions& options) {
  PublicCallScope call("cpprun::get_model_state_dict");
  TORCH_CHECK(options.file_key_prefix().empty() && options.consume_prefix_in_state_dict_if_present().empty(),
              "cpprun: get_model_state_dict gives the model's own names; file_key_prefix applies to loads "
              "(set_model_state_dict, load_state_dict), as does consume_prefix_in_state_dict_if_present: leave "
              "both empty here.");
  const StateView view = state_view(source);
  at::NoGradGuard no_grad;
  // Under cpu_offload a gathered tensor lives on the device only until it is copied to the CPU
  // (the first rank) or dropped (the others), as PyTorch's _gather_state_dict does.
  const bool keep = !options.cpu_offload() || view.team.is_root();
  const NamedTensors whole = whole_state(view, [&](const at::Tensor& tensor) {
    if (!keep) return at::Tensor();
    return options.cpu_offload() ? tensor.detach().to(at::kCPU) : tensor.detach();
  });  // collective: every rank gathers
  torch::OrderedDict<std::string, at::Tensor> out;
  if (!keep) return out;
  out.reserve(whole.size());
  for (const auto& [name, tensor] : whole) out.insert(name, tensor);
  return out;
}

namespace {

// Note [One report on every rank]
// The ranks that hold one model (DDP's replicas, FSDP's shards, a tensor-parallel group) each
// give set_model_state_dict their own dict. Under strict(false) a dict that lacks a name on one
// rank only loaded there and not elsewhere: the replicas then differed for good, each rank with
// its own report (an audit, 2026-12-07). So the ranks compare their reports, and whether they
// load strictly, with the first rank's before anything is copied, and a difference is refused on
// every rank. Strict loads take part too (their reports are empty where the check passed), so
// that ranks given different strictness meet in the same collectives. Returns `failure`, or this
// rank's refusal when its report differs; the agreement that follows tells the others.
std::exception_ptr refuse_other_reports(const CheckpointTeam& team, const StateDictLoadReport& report, bool strict,
                                        std::exception_ptr failure) {
  // A letter for the strictness, then the report's bytes; empty: the first rank's check failed.
  const std::string mine = (strict ? "s" : "l") + encode_report(report);
  std::string first = failure ? std::string() : mine;
  team.broadcast_bytes(first);
  if (failure || first.empty() || first == mine) return failure;
  const auto said = [](const std::string& bytes) {
    const std::string strictness = bytes[0] == 's' ? "strict, " : "strict(false), ";
    return strictness + describe_report(decode_report(bytes.substr(1)));
  };
  return std::make_exception_ptr(StateDictMismatchError(
      "cpprun::set_model_state_dict: the ranks that hold this model were given dicts (or options) that differ: on "
      "this rank (rank " + std::to_string(cpprun::rank()) + ") " + said(mine) + "; on the team's first rank " +
      said(first) + ". Nothing was loaded: loading them would leave the replicas (or shards) different from "
      "each other. Give every rank the same names and options."));
}

}  // namespace

StateDictLoadReport set_model_state(StateSource source, const torch::OrderedDict<std::string, at::Tensor>& state,
                                    const StateDictOptions& options) {
  PublicCallScope call("cpprun::set_model_state_dict");
  NamedTensors given;
  given.reserve(state.size());
  for (const auto& item : state) given.emplace_back(item.key(), item.value());
  const std::string where = "the state dict given to set_model_state_dict";
  const StateView view = state_view(source);
  at::NoGradGuard no_grad;
  // What the dict's tensors replace, and what strict(false) leaves where it has nothing; a tensor
  // the model holds whole is the model's own, loaded in place.
  const NamedTensors whole = whole_state(view);
  StateDictLoadReport report;
  if (options.broadcast_from_rank0()) {
    report = load_on_root_and_broadcast(whole, view.team, [&] { return load_named_tensors(whole, given, where, options); });
  } else {
    // Every rank its own dict: all check before any copies, so that one rank's mismatch leaves
    // every rank's model as it was.
    std::exception_ptr failure;
    try {
      report = check_named_tensors(whole, given, where, options);
    } catch (...) {
      failure = std::current_exception();
    }
    failure = refuse_other_reports(view.team, report, options.strict(), failure);
    view.team.agree(failure, "set_model_state_dict");
    copy_named_tensors(whole, given, options);
  }
  scatter_whole_state(view, whole);
  warn_left_as_they_were(report, where, first_to_warn(view.team));
  return report;
}

void save_optimizer_state(StateSource source, torch::optim::Optimizer& optimizer, const std::string& path,
                          const StateDictSaveOptions& options) {
  PublicCallScope call("cpprun::save_optimizer_state_dict");
  check_optimizer_path(path, "save_optimizer_state_dict");
  const StateView view = state_view(source);
  at::NoGradGuard no_grad;
  save_optimizer_state_dict(optimizer_params(view), optimizer, view.team, path, options);
}

namespace {

// The save id PATH records (a directory: its index's; a .safetensors file: its header's); ""
// when it records none (a .pt file, a file another tool wrote, a path that is not there).
std::string save_id_in(const std::string& path, std::string_view stem) {
  namespace fs = std::filesystem;
  std::map<std::string, std::string> metadata;
  if (is_sharded_state_dict_path(path)) {
    const fs::path index = fs::path(sharded_directory_of(path, stem)) / index_file_name(stem);
    if (!fs::exists(index)) return "";
    metadata = read_index_file(index.string()).metadata;
  } else if (has_safetensors_extension(path)) {
    metadata = read_safetensors_metadata(path).value_or(std::map<std::string, std::string>());
  }
  const auto id = metadata.find(std::string(kSaveIdKey));
  return id == metadata.end() ? "" : id->second;
}

// What an interrupted save left beside the two paths (their directories', once if the same).
std::string interrupted_save_notes(const std::string& model_path, const std::string& optimizer_path) {
  namespace fs = std::filesystem;
  const auto directory = [](const std::string& path, std::string_view stem) {
    if (is_sharded_state_dict_path(path)) return sharded_directory_of(path, stem);
    const fs::path parent = fs::path(path).parent_path();
    return parent.empty() ? std::string(".") : parent.string();
  };
  const std::string model_dir = directory(model_path, kModelStem);
  const std::string optimizer_dir = directory(optimizer_path, kOptimizerStem);
  return interrupted_save_note(model_dir) + (optimizer_dir == model_dir ? "" : interrupted_save_note(optimizer_dir));
}

}  // namespace

// Note [A pair of files from one save]
// A model and its optimizer saved to two paths are renamed into place one after the other, so a
// save cut short between the renames (a kill, a full disk) leaves the new model beside the old
// optimizer. Loaded by two calls, neither sees the other file: the pair loaded without a word and
// training went on with another step's optimizer state (an audit, 2026-12-07). The pair load
// compares the two save ids first and loads neither when they differ.
void check_one_save(const CheckpointTeam& team, const ProcessGroup* owners, const std::string& model_path,
                    const std::string& optimizer_path) {
  std::exception_ptr failure;
  if (is_save_root(team, owners)) {
    try {
      const std::string model_id = save_id_in(model_path, kModelStem);
      const std::string optimizer_id = save_id_in(optimizer_path, kOptimizerStem);
      if (!model_id.empty() && !optimizer_id.empty() && model_id != optimizer_id) {
        const bool one_directory = model_path == optimizer_path;
        const std::string paths = "\"" + model_path + (one_directory ? "" : "\", \"" + optimizer_path) + "\"";
        throw CorruptCheckpointError(
            "cpprun: load_state_dict(model, optimizer, " + paths + "): the optimizer's " +
            (one_directory ? "files are" : "file is") + " from another save (save id \"" + optimizer_id +
            "\") than the model's (save id \"" + model_id + "\"), and nothing was loaded: a save cut short between "
            "the model's files and the optimizer's leaves a new model beside the old optimizer. Load a pair saved "
            "together (an earlier checkpoint), or save both again." +
            interrupted_save_notes(model_path, optimizer_path));
      }
    } catch (...) {
      failure = std::current_exception();
    }
  }
  share_save_root_failure(team, owners, failure);
}

void check_one_save(StateSource source, const std::string& model_path, const std::string& optimizer_path) {
  PublicCallScope call("cpprun::load_state_dict");
  check_one_save(state_view(source).team, nullptr, model_path, optimizer_path);
}

void check_save_files(StateSource source, const std::map<std::string, std::string>& files) {
  PublicCallScope call("cpprun::save_state_dict");
  check_save_files(state_view(source).team, nullptr, files);
}

void write_save_files(StateSource source, const std::string& dir, const std::map<std::string, std::string>& files) {
  PublicCallScope call("cpprun::save_state_dict");
  write_save_files(state_view(source).team, nullptr, dir, files);
}

void load_optimizer_state(StateSource source, torch::optim::Optimizer& optimizer, const std::string& path) {
  PublicCallScope call("cpprun::load_optimizer_state_dict");
  const StateView view = state_view(source);
  at::NoGradGuard no_grad;
  load_optimizer_state_dict(optimizer_params(view), optimizer, view.team, path);
}

OptimizerStateDict get_optimizer_state(StateSource source, torch::optim::Optimizer& optimizer,
                                       const StateDictOptions& options) {
  PublicCallScope call("cpprun::get_optimizer_state_dict");
  const StateView view = state_view(source);
  at::NoGradGuard no_grad;
  return get_optimizer_state(optimizer_params(view), optimizer, view.team, options);
}

void set_optimizer_state(StateSource source, torch::optim::Optimizer& optimizer, const OptimizerStateDict& state,
                         const StateDictOptions& options) {
  PublicCallScope call("cpprun::set_optimizer_state_dict");
  const StateView view = state_view(source);
  at::NoGradGuard no_grad;
  set_optimizer_state(optimizer_params(view), optimizer, view.team, state, options);
}

std::string checkpoint_directory(const std::string& path, const char* call) {
  namespace fs = std::filesystem;
  const bool saving = std::string(call) == "save_state_dict";
  const std::string files = std::string("For files, call ") + call + "(model, \"model.safetensors\") and " +
                            (saving ? "save" : "load") + "_optimizer_state_dict(model, optimizer, \"optimizer.safetensors\").";
  TORCH_CHECK(!path.empty(), "cpprun: ", call, "(model, optimizer, \"\"): the directory's name is empty.");
  std::error_code ignored;
  const bool exists = fs::exists(path, ignored);
  // A name that reads as a file: saving a directory under it would surprise more than refusing.
  std::string ext = fs::path(path).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  const bool file_name = ext == ".safetensors" || ext == ".pt" || ext == ".pth" || ext == ".bin";
  if (!saving && !exists) {
    throw std::system_error(std::make_error_code(std::errc::no_such_file_or_directory),
                            "cpprun: load_state_dict(model, optimizer, \"" + path + "\"): " + path + " does not exist" +
                                (file_name ? std::string(" (and this call takes a directory. ") + files + ")" : ""));
  }
  TORCH_CHECK(!exists || fs::is_directory(path, ignored), "cpprun: ", call, "(model, optimizer, \"", path, "\"): ", path,
              " is a file, but the model and its optimizer in one call take a directory, where their files go side "
              "by side. ", files);
  if (path.back() == '/') return path;
  TORCH_CHECK(exists || !file_name, "cpprun: ", call,
              "(model, optimizer, \"", path, "\"): the model and its optimizer in one call take a directory, and ",
              path, " reads as a file's name. ", files, " (A directory may have any other name, with or without "
              "a trailing '/'.)");
  return path + "/";
}

AsyncSave save_model_and_optimizer_async(StateSource source, torch::optim::Optimizer& optimizer,
                                         const std::string& model_path, const std::string& optimizer_path,
                                         const StateDictSaveOptions& options) {
  PublicCallScope call("cpprun::save_async");
  check_async_save_paths(model_path, optimizer_path);
  const StateView view = state_view(source);
  at::NoGradGuard no_grad;
  std::vector<AsyncSavePart> parts;
  parts.push_back(model_part(view, model_path));
  // A directory's optimizer state as the model's: FSDP's rows each rank's own, the rest its writers'.
  const bool directory = is_sharded_state_dict_path(optimizer_path);
  RowsInPlace rows;  // See Note [An asynchronous save in place] in checkpoint/async_save.cpp
  parts.push_back(optimizer_part(
      directory ? optimizer_state_to_save(optimizer_params(view), optimizer, nullptr, &view.team,
                                          "saving the optimizer state to " + optimizer_path, WholeTensors::kOwned,
                                          &rows)
                : optimizer_state_to_save(optimizer_params(view), optimizer),
      optimizer_path, directory));
  parts.back().rows = std::move(rows);
  return start_async_save(std::move(parts), view.team, options);
}

}  // namespace cpprun::detail
