// The entry points of cpprun/state_dict.h and cpprun/optimizer_state_dict.h, once for every
// wrapper and for a plain module: the source describes its state (checkpoint/state_view.h); the
// whole tensors are gathered by placement and written over the view's team, or read, broadcast
// and cut back to each rank's part. Nothing here knows which wrapper it saves.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <map>
#include <utility>

#include "checkpoint/state_view.h"
#include "checkpoint/async_optimizer_save.h"
#include "checkpoint/async_save.h"
#include "checkpoint/optimizer_state_dict.h"
#include "checkpoint/sharded_state_dict.h"
#include "checkpoint/state_dict.h"
#include "core/tensor_parallel_splits.h"
#include "cpprun/detail/data_parallel_core.h"
#include "cpprun/optimizer_state_dict.h"
#include "cpprun/state_dict.h"

namespace cpprun::detail {
namespace {

StateView view_of(StateSource source) {
  if (source.wrapper) {
    StateView view;
    source.wrapper->describe_state(view);
    return view;
  }
  TORCH_INTERNAL_ASSERT(source.module, "a checkpoint of nothing");
  // Alone, or with tensor-parallel splits the ranks of their groups (every one calls the save).
  return module_state_view(*source.module, tensor_parallel_splits(*source.module));
}

// The model's parameters as its optimizer steps them (the entries' local tensors), with each
// state tensor gathered and cut by its parameter's placement.
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

}  // namespace

void save_model_state(StateSource source, const std::string& path, const StateDictSaveOptions& options) {
  check_state_dict_path(path);  // before any collective: every rank refuses alike
  const StateView view = view_of(source);
  at::NoGradGuard no_grad;
  save_state_dict(whole_state(view), view.team, path, options);
}

StateDictLoadReport load_model_state(StateSource source, const std::string& path, const StateDictOptions& options) {
  const StateView view = view_of(source);
  at::NoGradGuard no_grad;
  // The current whole state: what the file's tensors replace, and what a strict(false) load
  // leaves where the file has nothing (a replicated tensor is the module's own: loaded in place).
  const NamedTensors whole = whole_state(view);
  StateDictLoadReport report = load_state_dict(whole, view.team, path, options);
  scatter_whole_state(view, whole);
  return report;
}

AsyncSave save_model_state_async(StateSource source, const std::string& path, const StateDictSaveOptions& options) {
  check_state_dict_path(path);
  const StateView view = view_of(source);
  at::NoGradGuard no_grad;
  return start_async_save(whole_state(view), view.team, path, options);  // copied before it returns
}

void save_optimizer_state(StateSource source, torch::optim::Optimizer& optimizer, const std::string& path,
                          const StateDictSaveOptions& options) {
  check_optimizer_path(path, "save_optimizer_state_dict");
  const StateView view = view_of(source);
  at::NoGradGuard no_grad;
  save_optimizer_state_dict(optimizer_params(view), optimizer, view.team, path, options);
}

void load_optimizer_state(StateSource source, torch::optim::Optimizer& optimizer, const std::string& path) {
  const StateView view = view_of(source);
  at::NoGradGuard no_grad;
  load_optimizer_state_dict(optimizer_params(view), optimizer, view.team, path);
}

AsyncSave save_model_and_optimizer_async(StateSource source, torch::optim::Optimizer& optimizer,
                                         const std::string& model_path, const std::string& optimizer_path,
                                         const StateDictSaveOptions& options) {
  check_async_save_paths(model_path, optimizer_path);
  const StateView view = view_of(source);
  at::NoGradGuard no_grad;
  NamedTensors model_state = whole_state(view);
  OptimizerStateToSave optimizer_state = optimizer_state_to_save(optimizer_params(view), optimizer);
  return start_async_save_with_optimizer(std::move(model_state), std::move(optimizer_state), view.team, model_path,
                                         optimizer_path, options);
}

}  // namespace cpprun::detail
