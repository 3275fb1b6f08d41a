// A model and its optimizer saved asynchronously as one save (cpprun::save_async(model, optimizer,
// ...), cpprun/optimizer_state_dict.h): both states copied on the calling thread, both written by
// one background thread (checkpoint/async_save.h), every file with one save id. Here: the paths it
// takes, and the optimizer's part of it.
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <string>

#include "checkpoint/optimizer_state_dict.h"
#include "checkpoint/async_save.h"

namespace cpprun::detail {

// Refuses paths the save cannot take, before any collective: every rank throws alike.
void check_async_save_paths(const std::string& model_path, const std::string& optimizer_path);

// The optimizer's part of an asynchronous save (start_async_save, beside the model's part), as
// save_optimizer_state_dict writes it: `saved` is optimizer_state_to_save's; `owned`, its
// tensors are the save's own (a directory's, with WholeTensors::kOwned; FSDP's rows, written in
// place, the caller sets as the part's `rows`).
AsyncSavePart optimizer_part(OptimizerStateToSave saved, const std::string& path, bool owned);

}  // namespace cpprun::detail
