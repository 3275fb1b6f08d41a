// See state_view.h.
#include "checkpoint/state_view.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/nn/module.h>

#include <map>
#include <unordered_map>
#include <unordered_set>

#include "checkpoint/state_dict.h"
#include "core/tensor_parallel_splits.h"
#include "core/tensor_parallel_state.h"
#include "cpprun/collectives.h"
#include "cpprun/detail/data_parallel_core.h"
#include "cpprun/state_dict.h"

namespace cpprun::detail {

StateView module_state_view(torch::nn::Module& module, const std::map<std::string, TensorParallelSplit>& splits,
                            std::optional<ProcessGroup> replicas) {
  StateView view;
  view.team = CheckpointTeam(std::move(replicas), tensor_parallel_groups(splits));
  std::unordered_set<const c10::TensorImpl*> parameters;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    if (item.value().defined()) parameters.insert(item.value().unsafeGetTensorImpl());
  }
  std::unordered_map<const c10::TensorImpl*, std::size_t> entry_of;
  for (const auto& [name, tensor] : module_state(module)) {
    const auto [at, first] = entry_of.emplace(tensor.unsafeGetTensorImpl(), view.entries.size());
    view.names.emplace_back(name, at->second);
    if (!first) continue;  // a tied tensor's other name
    StateEntry entry;
    entry.name = name;
    entry.local = tensor;
    entry.module_tensor = tensor;
    entry.parameter = parameters.count(tensor.unsafeGetTensorImpl()) > 0;
    entry.device = tensor.device();
    entry.whole_sizes = tensor.sizes().vec();
    const auto split = splits.find(name);
    if (split != splits.end()) {
      const int64_t dim = split->second.dim < 0 ? split->second.dim + tensor.dim() : split->second.dim;
      TORCH_CHECK(dim >= 0 && dim < tensor.dim(), "cpprun: the tensor-parallel split of \"", name, "\" says dim ",
                  split->second.dim, ", which its shard of shape ", tensor.sizes(), " does not have.");
      entry.whole_sizes[static_cast<std::size_t>(dim)] *= split->second.group.size();
      entry.placement.tensor_parallel = split->second;
    }
    view.entries.push_back(std::move(entry));
  }
  return view;
}

StateView state_view(const StateSource& source) {
  if (source.wrapper) {
    StateView view;
    source.wrapper->describe_state(view);
    return view;
  }
  TORCH_INTERNAL_ASSERT(source.module, "a checkpoint of nothing");
  // Alone, or with tensor-parallel splits the ranks of their groups (every one calls the save).
  return module_state_view(*source.module, tensor_parallel_splits(*source.module));
}

at::Tensor gather_whole(const StateEntry& entry, const at::Tensor& local) {
  at::NoGradGuard no_grad;
  at::Tensor t = local.detach();
  if (const auto& rows = entry.placement.rows) {
    // Rank q's rows are [q*C, q*C + C) (fewer, or none, at the end): padded to C rows each, one
    // all-gather puts them end to end, and the first `rows` rows are the tensor.
    const int64_t chunk_numel = rows->rows_per_rank * rows->row_numel;
    const at::Tensor on_device = t.to(entry.device);
    at::Tensor chunk = at::zeros({chunk_numel}, on_device.options());
    if (rows->local_rows > 0) chunk.narrow(0, 0, rows->local_rows * rows->row_numel).copy_(on_device.reshape({-1}));
    at::Tensor all = at::empty({chunk_numel * rows->group.size()}, on_device.options());
    all_gather_into(rows->group, all, chunk);
    t = all.narrow(0, 0, rows->rows * rows->row_numel).view(rows->sizes);
  }
  if (const auto& split = entry.placement.tensor_parallel) t = gather_tensor_parallel_split(t.to(entry.device), *split);
  return t;
}

at::Tensor local_part(const StateEntry& entry, const at::Tensor& whole) {
  at::Tensor t = whole;
  if (const auto& split = entry.placement.tensor_parallel) t = tensor_parallel_shard(t, *split);
  if (const auto& rows = entry.placement.rows) {
    t = t.reshape({rows->rows, rows->row_numel}).narrow(0, rows->first_row, rows->local_rows).reshape(rows->local_sizes);
  }
  return t;
}

NamedTensors whole_state(const StateView& view, const std::function<at::Tensor(const at::Tensor&)>& take) {
  std::vector<at::Tensor> whole;
  whole.reserve(view.entries.size());
  // In the entries' order on every rank: each gather meets its peers'.
  for (const auto& entry : view.entries) {
    at::Tensor tensor = entry.placement.replicated() ? entry.local : gather_whole(entry, entry.local);
    whole.push_back(take ? take(tensor) : std::move(tensor));
  }
  NamedTensors out;
  out.reserve(view.names.size());
  for (const auto& [name, index] : view.names) out.emplace_back(name, whole[index]);
  return out;
}

// Note [A directory holds the root's buffers]
// Parameters are the same on every replica (DDP broadcasts them at construction and averages the
// gradients; FSDP gathers them), but buffers need not be: BatchNorm updates its running statistics
// in every forward from the rank's own batch, after DDP's broadcast_buffers has synced them at the
// forward's start (as PyTorch's DDP), and FSDP syncs them never. A single file is written by the
// team's root, so it holds the root's buffers; a directory's shares are written by several ranks,
// each with its own buffers, so without this it would mix ranks' statistics. The writers take the
// root's buffers instead (copies: a save leaves the model as it was), which keeps the file plan as
// it is and costs one coalesced broadcast of the buffers' bytes (BatchNorm's: 2 floats and a
// counter per channel), nothing for parameters. Every rank's view has the same entries, so every
// rank takes part alike, or none.
void use_root_buffers(const StateView& view, NamedTensors& state) {
  std::unordered_map<std::size_t, at::Tensor> root_copy;  // entry -> the root's value
  std::vector<at::Tensor> copies;
  for (std::size_t i = 0; i < view.entries.size(); ++i) {
    const StateEntry& entry = view.entries[i];
    if (entry.parameter || !entry.placement.replicated()) continue;
    copies.push_back(entry.local.detach().clone());
    root_copy.emplace(i, copies.back());
  }
  view.team.broadcast_tensors(copies);
  for (std::size_t k = 0; k < view.names.size(); ++k) {
    const auto found = root_copy.find(view.names[k].second);
    if (found != root_copy.end()) state[k].second = found->second;
  }
}

void scatter_whole_state(const StateView& view, const NamedTensors& whole) {
  {
    at::NoGradGuard no_grad;
    std::map<std::string, const at::Tensor*> by_name;
    for (const auto& [name, tensor] : whole) by_name.emplace(name, &tensor);
    for (const auto& entry : view.entries) {
      const auto found = by_name.find(entry.name);
      TORCH_INTERNAL_ASSERT(found != by_name.end(), "no whole tensor for state entry ", entry.name);
      if (found->second->unsafeGetTensorImpl() == entry.local.unsafeGetTensorImpl()) continue;  // loaded in place
      entry.local.detach().copy_(local_part(entry, *found->second));
    }
  }
  if (view.after_load) view.after_load();
}

}  // namespace cpprun::detail
