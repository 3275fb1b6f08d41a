// A model and its optimizer saved asynchronously as one save (cpprun::save_async(model, optimizer,
// ...), cpprun/optimizer_state_dict.h): both states copied on the calling thread, both written by
// one background thread (checkpoint/async_save.h), every file with one save id.
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <string>

#include "checkpoint/optimizer_state_dict.h"
#include "cpprun/async_save.h"
#include "checkpoint/checkpoint_team.h"
#include "cpprun/state_dict_options.h"

namespace cpprun::detail {

// Refuses paths the save cannot take, before any collective: every rank throws alike.
void check_async_save_paths(const std::string& model_path, const std::string& optimizer_path);

// Starts the save of a model's state dict, `model_state` (module_state(module), whole: FSDP
// gathers it first; under mixed precision FSDP's fp32 masters), and `optimizer_state`
// (optimizer_state_to_save's), as save_state_dict and save_optimizer_state_dict would write them.
// Collective over `team` (alone: this process).
AsyncSave start_async_save_with_optimizer(NamedTensors model_state, OptimizerStateToSave optimizer_state,
                                          const CheckpointTeam& team, const std::string& model_path,
                                          const std::string& optimizer_path, const StateDictSaveOptions& options);

}  // namespace cpprun::detail
