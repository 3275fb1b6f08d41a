// Asynchronous state-dict saves (cpprun::save_async, cpprun/state_dict.h): the state is copied
// to CPU memory on the calling thread, then written on a background thread; the handle
// (cpprun/async_save.h) waits for it. See Note [Asynchronous save across ranks] in the .cpp.
#pragma once

#include <torch/nn/module.h>

#include <string>

#include "cpprun/async_save.h"
#include "cpprun/process_group.h"
#include "cpprun/state_dict_options.h"
#include "support/torch_save_file.h"

namespace cpprun::detail {

// Starts saving `module`'s state to PATH (a file, or a directory in Hugging Face's sharded
// layout), as save_state_dict would. `group` null: this process alone. Else collective over it,
// every rank holding the full state (FSDP gathers it first): the save id is broadcast here, and
// each rank copies only what it writes (a file: rank 0 all of it; a directory: its share).
// Registers the save as this process's latest (see finish_previous_save in cpprun/state_dict.h).
AsyncSave start_async_save(torch::nn::Module& module, const ProcessGroup* group, const std::string& path,
                           const StateDictSaveOptions& options);
// The same for tensors that are not a module's own (FSDP's gathered fp32 masters under mixed
// precision), the same names and shapes on every rank; copied before it returns.
AsyncSave start_async_save(const NamedTensors& state, const ProcessGroup* group, const std::string& path,
                           const StateDictSaveOptions& options);

// CPU copies of `state` that training cannot change: pinned host memory for a tensor on a GPU;
// a tensor listed under two names (tied weights) copied once, so files encode it as the original.
NamedTensors snapshot_state(const NamedTensors& state);

}  // namespace cpprun::detail
