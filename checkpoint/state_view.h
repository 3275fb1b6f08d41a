// A distributed state view: what a model (a plain module, DDP, FSDP at any stage, HSDP, modules
// split by tensor parallelism) holds, described as entries, so that one checkpoint module saves
// and loads every wrapper alike, as PyTorch's DTensor placements let torch.distributed.checkpoint
// do. An entry is one tensor of the unwrapped model under its state_dict() name: this rank's local
// tensor and its placement, i.e. how the local tensor relates to the whole one:
//   replicated            the local tensor is the whole one (DDP; buffers);
//   tensor-parallel split the whole one is cut along a dim over a group (Megatron's layers);
//   row shard             FSDP: this rank holds rows [first, first + local) of dim 0 over the
//                         shard group, of the (tensor-parallel local) tensor.
// Under FSDP's mixed precision the local tensor is the fp32 shard the optimizer steps: the master,
// not the compute copy. The optimizer's state of a parameter has the parameter's placement.
// The checkpoint code knows no wrapper type: a wrapper fills a view (describe_state) and is told
// when a load changed its local tensors (after_load).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/checkpoint_team.h"
#include "cpprun/process_group.h"
#include "cpprun/tensor_parallel_split.h"
#include "support/torch_save_file.h"

namespace torch::nn {
class Module;
}  // namespace torch::nn

namespace cpprun::detail {

// FSDP's dim-0 sharding of one tensor across `group` (fsdp/param_bucket.h's ShardedParam): rank
// r of W holds rows [r*C, r*C + local_rows) of `rows`, C = rows_per_rank; the rows past `rows`
// are padding that no rank keeps.
struct RowShard {
  ProcessGroup group;
  int64_t rows = 0;
  int64_t row_numel = 0;
  int64_t rows_per_rank = 0;
  int64_t first_row = 0;
  int64_t local_rows = 0;
  std::vector<int64_t> sizes;        // the shape of the tensor sharded (a tensor-parallel split, or the whole)
  std::vector<int64_t> local_sizes;  // the local tensor's shape
};

struct Placement {
  std::optional<TensorParallelSplit> tensor_parallel;  // outer: the whole tensor -> this rank's split
  std::optional<RowShard> rows;                        // inner: the split (or whole) -> this rank's rows
  bool replicated() const { return !tensor_parallel && !rows; }
};

struct StateEntry {
  std::string name;                 // its state_dict() name (a tied tensor's first)
  at::Tensor local;                 // what this rank holds; the tensor the optimizer steps
  Placement placement;
  std::vector<int64_t> whole_sizes;  // the unsplit, unsharded shape, as the file holds it
  bool parameter = false;            // a parameter (may have optimizer state), not a buffer
  // The device collectives over the entry's groups take (an offloaded shard lives on the CPU).
  c10::Device device = c10::kCPU;
  // The module's own tensor (FSDP's unsharded parameter; otherwise `local`): how a wrapper finds
  // the entry of one of its tensors.
  at::Tensor module_tensor;
};

struct StateView {
  std::vector<StateEntry> entries;  // each tensor once, parameters first
  // The state_dict() names in the module's order (parameters, then buffers), each with its entry:
  // a tied tensor is listed under each of its names, as Python's state_dict() lists it.
  std::vector<std::pair<std::string, std::size_t>> names;
  CheckpointTeam team;
  // Called on every rank after a load wrote the local tensors (FSDP remakes its full parameters).
  std::function<void()> after_load;
};

struct StateSource;  // cpprun/state_dict.h: a wrapper or a module
// The view of what a checkpoint saves: a wrapper's (its describe_state), or a module's with its
// tensor-parallel splits (cpprun::tensor_parallel_splits; every rank of their groups saves).
StateView state_view(const StateSource& source);

// The view of a module: every parameter and buffer replicated over `replicas` (none: this process
// alone), except those `splits` names (cpprun::tensor_parallel_splits), which are tensor-parallel
// splits; the team is `replicas` and the splits' groups.
StateView module_state_view(torch::nn::Module& module, const std::map<std::string, TensorParallelSplit>& splits,
                            std::optional<ProcessGroup> replicas = std::nullopt);

// The whole tensor of which `local` (the entry's local tensor, or an optimizer state tensor of its
// shape) is this rank's part, on every rank of the entry's groups. Collective over them.
at::Tensor gather_whole(const StateEntry& entry, const at::Tensor& local);
// This rank's part of `whole` (shaped as entry.whole_sizes): a tensor of the local tensor's shape.
at::Tensor local_part(const StateEntry& entry, const at::Tensor& whole);

// The whole state by name, in the module's order (a tied tensor under each name, one tensor):
// the same on every rank of the team. Collective: every entry is gathered. `take`, when given,
// is applied to each whole tensor as soon as it is gathered, before the next gather (e.g. a copy
// to the CPU, or an undefined tensor to drop it), so at most one gathered tensor is held at once.
NamedTensors whole_state(const StateView& view, const std::function<at::Tensor(const at::Tensor&)>& take = nullptr);
// For a save to a sharded directory that several ranks write shares of (state_to_save,
// checkpoint/writer_gather.h), on `state` (the view's names, in order, as whole_state or
// gather_view_for_writers gives them): each replicated entry that is not a parameter (BatchNorm's
// running statistics, which each rank updates from its own batch) becomes a copy of the team
// root's, so that the directory holds what the root's single file would; the module's own buffers
// are left as they are. Collective over the team (one coalesced broadcast of the buffers). See
// Note [A directory holds the root's buffers] in the .cpp.
void use_root_buffers(const StateView& view, NamedTensors& state);
// Copies this rank's part of each whole tensor in `whole` (as whole_state made it) into the
// entries' local tensors, then runs view.after_load. Local, but after_load may be collective.
void scatter_whole_state(const StateView& view, const NamedTensors& whole);

}  // namespace cpprun::detail
