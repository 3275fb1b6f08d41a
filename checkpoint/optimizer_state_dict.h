// An optimizer's state by parameter name, in the flat form PyTorch's
// get_optimizer_state_dict(..., StateDictOptions(full_state_dict=True,
// flatten_optimizer_state_dict=True)) gives it: a tensor "state.<fqn>.<name>" per state
// ("state.fc1.weight.exp_avg"; "state.fc1.weight.step" a 0-d float32, as PyTorch keeps it), each
// of the whole parameter's shape, in a .safetensors file or a sharded directory beside a model's
// (optimizer-0000R-of-0000N.safetensors + optimizer.safetensors.index.json). The param groups'
// options (lr, betas, ...), which safetensors cannot hold as tensors, are JSON in the files'
// __metadata__ ("cpprun_param_groups": [{"params": [fqn, ...], "lr": ...}]), with the optimizer's
// kind ("cpprun_optimizer": "AdamW"). Knows SGD, Adam and AdamW (checkpoint/optimizer_state.h).
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstddef>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_team.h"
#include "checkpoint/optimizer_flat_state.h"
#include "checkpoint/state_view.h"
#include "checkpoint/writer_gather.h"
#include "cpprun/state_dict_options.h"
#include "support/torch_save_file.h"

namespace cpprun::detail {

// The __metadata__ keys of an optimizer's files.
inline constexpr const char* kOptimizerKindKey = "cpprun_optimizer";
inline constexpr const char* kParamGroupsKey = "cpprun_param_groups";

// A model's parameters as its optimizer sees them: what a wrapper hands to the functions below.
struct OptimizerParams {
  std::vector<std::string> names;                // each parameter's name (a tied one's first)
  std::vector<at::Tensor> stepped;               // the tensor the optimizer steps (FSDP: this rank's rows)
  std::vector<std::vector<int64_t>> full_sizes;  // the whole parameter's shape
  // Each parameter's entry in the view it came from (which outlives these), for a sharded save
  // that gathers each state tensor only to its writer; empty: that save gathers through `gather`.
  std::vector<const StateEntry*> entries;
  // A tied parameter's other names -> its index. Saved under its first name only, as PyTorch's
  // get_optimizer_state_dict does; a file naming it by another (PyTorch's set_optimizer_state_dict
  // takes either) loads too.
  std::map<std::string, std::size_t> aliases;
  // A state tensor of parameter i as this rank holds it -> the whole tensor on every rank
  // (collective over the parameter's groups: checkpoint/state_view.h's gather_whole), and a whole
  // tensor -> this rank's part. Unset: every rank's state is already whole.
  std::function<at::Tensor(std::size_t, const at::Tensor&)> gather;
  std::function<at::Tensor(std::size_t, const at::Tensor&)> local_part;
  // FSDP's shard group, when a rank may hold no rows of a parameter (and so no state for it)
  // where the others do: the ranks agree which parameters have state before gathering.
  std::optional<ProcessGroup> shard_group;
  // Parameters whose state another owner saves under its own name, which `aliases` maps here (a
  // pipeline's last stage's copy of a head tied to the first stage's embedding): left out of
  // this owner's save, and loaded from that name.
  std::set<std::string> saved_by_another;
};

// The parameters of a view (checkpoint/state_view.h) as its optimizer steps them: each entry's
// local tensor, its state gathered and cut by the entry's placement. Refers to `view`, which must
// outlive the result.
OptimizerParams optimizer_params(const StateView& view);

// What a save of `optimizer`'s state writes: the tensors "state.<name>.<what>", whole (FSDP
// gathers each over params.shard_group: collective), and the files' __metadata__ (kind, groups).
// The tensors of a DDP or plain module's optimizer are its own: copy them before it steps again.
struct OptimizerStateToSave {
  NamedTensors state;
  std::map<std::string, std::string> metadata;
  // What the metadata's groups say: each group's parameter names and its options as JSON
  // members (", \"lr\": 0.001, ..."), for merging the groups of several owners.
  std::vector<std::vector<std::string>> group_params;
  std::vector<std::string> group_options;
};
// `take`, when given, is applied to each state tensor as soon as it is whole, before the next is
// gathered (get_optimizer_state_dict's cpu_offload: a copy to the CPU, or an undefined tensor to
// drop it), as whole_state's `take`. `writers` (a sharded save by that team; params.entries
// set): each state tensor is whole only on the writers of its file, a meta tensor of its shape
// elsewhere (checkpoint/writer_gather.h; `what` names the save in its errors; `hold` says whether
// a writer's tensors may be the optimizer's own; `in_place`: FSDP's rows are written in place, as
// gather_for_writers's), and `take` is unused.
OptimizerStateToSave optimizer_state_to_save(const OptimizerParams& params, torch::optim::Optimizer& optimizer,
                                             const std::function<at::Tensor(const at::Tensor&)>& take = nullptr,
                                             const CheckpointTeam* writers = nullptr, const std::string& what = {},
                                             WholeTensors hold = WholeTensors::kMayShare,
                                             RowsInPlace* in_place = nullptr);
// The groups of every owner of `owners` (pipeline stages, each with its own optimizer) as one
// list, as the unsplit model's optimizer would have them: group g holds every owner's group g's
// parameters, with their options, which must agree (else an error naming the group, on every
// rank). Collective over `owners`; sets `saved`'s groups and metadata.
void merge_owned_param_groups(OptimizerStateToSave& saved, const ProcessGroup& owners);
// Refuses a PATH an optimizer's state cannot be saved to (not .safetensors, not a directory).
void check_optimizer_path(const std::string& path, const char* call);

// Writes `optimizer`'s state to PATH (.safetensors, or a directory: "optimizer" files).
// Collective over `team` (alone: this process): the root writes a file, every writer its share
// of a directory, with the root's save id (options.save_id(), else drawn).
void save_optimizer_state_dict(const OptimizerParams& params, torch::optim::Optimizer& optimizer,
                               const CheckpointTeam& team, const std::string& path,
                               const StateDictSaveOptions& options);
// Reads PATH into `optimizer` (each rank its part, at any world size): its state and its param
// groups' options. Strict: another optimizer kind, parameters missing or unexpected, a state
// tensor of the wrong shape, a directory whose optimizer files differ in save id from each other
// or from the model's index there: one error listing every fault, naming the file, and nothing
// is changed. The team's root reads, every rank gets the same bytes, and every rank throws alike.
// `owners` (pipeline stages): the checkpoint holds every owner's parameters, and this one loads
// its own; a parameter no owner holds is unexpected, and the load is refused on every rank when it
// does not fit any owner (checkpoint/owned_state.h).
void load_optimizer_state_dict(const OptimizerParams& params, torch::optim::Optimizer& optimizer,
                               const CheckpointTeam& team, const std::string& path,
                               const ProcessGroup* owners = nullptr);
// What a save or load of the optimizer's state refuses on this rank alone before its first
// collective (an optimizer of a kind whose state cpprun cannot name, or stepping a tensor that is
// not one of `params`): local, so that a caller can share the refusal before every rank enters the
// save or load (pipeline stages).
void check_optimizer_params(const OptimizerParams& params, torch::optim::Optimizer& optimizer, const char* call);

// get_optimizer_state_dict (cpprun/optimizer_state_dict.h): what a save writes
// (optimizer_state_to_save), in the flattened form; collective over the parameters' groups.
// options.cpu_offload(): the team's root alone gets it, each tensor copied to the CPU as gathered.
FlatOptimizerState get_optimizer_state(const OptimizerParams& params, torch::optim::Optimizer& optimizer,
                                       const CheckpointTeam& team, const StateDictOptions& options);
// set_optimizer_state_dict: `state` made into what a file holds, then checked and applied as a load
// is (one error listing every fault, nothing changed). Every rank its own dict, the team agreeing
// before any rank applies; or, with options.broadcast_from_rank0(), the root's dict sent to all.
void set_optimizer_state(const OptimizerParams& params, torch::optim::Optimizer& optimizer, const CheckpointTeam& team,
                         const FlatOptimizerState& state, const StateDictOptions& options);

}  // namespace cpprun::detail
