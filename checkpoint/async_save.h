// Asynchronous state-dict saves (cpprun::save_async, cpprun/state_dict.h): the state is copied
// to CPU memory on the calling thread, then written on a background thread; the handle
// (cpprun/async_save.h) waits for it. See Note [Asynchronous save across ranks] in the .cpp.
#pragma once

#include <torch/nn/module.h>

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "cpprun/async_save.h"
#include "checkpoint/checkpoint_team.h"
#include "cpprun/state_dict_options.h"
#include "support/safetensors_index.h"
#include "support/torch_save_file.h"

namespace cpprun::detail {

// One set of files of a save: a model's state dict (STEM "model") or an optimizer's state
// ("optimizer", with its kind and param groups in `metadata`), to a file or a directory.
struct AsyncSavePart {
  NamedTensors state;  // whole tensors, the same on every rank; copied before start_async_save returns
  std::string path;
  std::string_view stem = kModelStem;
  std::map<std::string, std::string> metadata;
};

// Starts saving `parts` (each as save_state_dict / save_optimizer_state_dict would) on one
// background thread, under one save id, which every file records when there is more than one
// part (else, as the synchronous save, a file only when options.save_id() is given). Collective
// over `team` (alone: this process): the save id is broadcast here, and each writer copies only
// what it writes (a file: the root all of it; a directory: its share); the other ranks copy
// nothing and learn the result. Registers the save as this process's latest (see
// finish_previous_save in cpprun/state_dict.h).
AsyncSave start_async_save(std::vector<AsyncSavePart> parts, const CheckpointTeam& team,
                           const StateDictSaveOptions& options);
// One part: whole tensors (the same on every rank), copied before it returns.
AsyncSave start_async_save(const NamedTensors& state, const CheckpointTeam& team, const std::string& path,
                           const StateDictSaveOptions& options);

// CPU copies of `state` that training cannot change: pinned host memory for a tensor on a GPU;
// a tensor listed under two names (tied weights) copied once, so files encode it as the original.
NamedTensors snapshot_state(const NamedTensors& state);

}  // namespace cpprun::detail
