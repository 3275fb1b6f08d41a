// A checkpoint whose tensors are divided by name among the members of an `owners` group: each
// owner holds its own names' whole tensors (the same on every rank of its team, as whole_state
// makes them), no name held by two. Pipeline stages are such owners: stage s's ranks hold its
// children's tensors, named as the unsplit model names them, so the one checkpoint they save
// together is the unsplit model's and loads into it, into PyTorch, or into another split.
//
// Every rank of the job calls these, each with its owner's tensors, its team (the data- and
// tensor-parallel ranks of its stage, CheckpointTeam) and its owners group (its pipeline group:
// the ranks at its data- and tensor-parallel coordinates, one per stage). Only the owners groups
// of the teams' roots move tensors: in the others no rank is its team's root.
//   a file (.safetensors, .pt)  each owner's root sends its tensors to owner 0's, which writes;
//                               loading, each owner's root reads the file and keeps its names.
//   a directory                 each owner's writers write their share of its tensors, numbered
//                               after the owners before it; owner 0's root writes the index of
//                               all; loading, each owner's root reads only the files that hold
//                               its names.
// Strict loading is decided over all owners: a name no owner holds is unexpected, a name of any
// owner that the checkpoint lacks is missing, and a difference refuses the load on every rank
// before any tensor changes.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "checkpoint/async_save.h"
#include "checkpoint/checkpoint_team.h"
#include "cpprun/process_group.h"
#include "cpprun/state_dict_options.h"
#include "support/safetensors_index.h"
#include "support/torch_save_file.h"

namespace cpprun::detail {

// STEM names a directory's files ("model", or "optimizer" beside them); `metadata` goes into every
// .safetensors file's header and the index (an optimizer's kind and groups).
void save_owned_state(const NamedTensors& mine, const CheckpointTeam& team, const ProcessGroup& owners,
                      const std::string& path, const StateDictSaveOptions& options,
                      std::string_view stem = kModelStem, const std::map<std::string, std::string>& metadata = {});

// save_owned_state in the background, as cpprun::save_async: `parts` (a model's and, beside it, its
// optimizer's) hold this owner's tensors. What moves between ranks moves before it returns; the
// files are written on a background thread (Note [Asynchronous save across ranks] in
// checkpoint/async_save.cpp). A name two owners hold is refused on every rank before anything is written.
AsyncSave save_owned_state_async(std::vector<AsyncSavePart> parts, const CheckpointTeam& team,
                                 const ProcessGroup& owners, const StateDictSaveOptions& options);

// `into`: this owner's whole tensors, read into in place (by the team's root, then broadcast over
// the team). Every rank returns the same report, or throws the same error. `tied`: names whose
// tensors are copies of one (a weight tied across pipeline stages), held by different owners or
// one, the same list on every rank: a checkpoint holding two of them with different values is
// refused on every rank, nothing loaded, as the unsplit model refuses it (refuse_disagreeing_ties).
StateDictLoadReport load_owned_state(const NamedTensors& into, const CheckpointTeam& team, const ProcessGroup& owners,
                                     const std::string& path, const StateDictOptions& options,
                                     const std::vector<std::vector<std::string>>& tied = {});

}  // namespace cpprun::detail
