// A data-parallel model's full state, as torch::save writes the wrapped module: rank 0 alone
// writes and reads it; the values read are broadcast. DDP and FSDP both save through it.
#pragma once

#include <torch/nn/module.h>

#include <string>

#include "cpprun/process_group.h"

namespace cpprun::detail {

// Rank 0's parameters and buffers of `module` on every rank. Collective.
void broadcast_module_state(torch::nn::Module& module, const ProcessGroup& group);

// `module` with its full parameters current: rank 0 writes PATH atomically, with a checksum
// (cpprun/checkpoint_file.h); if it cannot, every rank throws. Collective.
void save_full_state(torch::nn::Module& module, const ProcessGroup& group, const std::string& path);
// Rank 0 reads PATH (a file torch::save or save_full_state wrote) into `module`'s parameters and
// buffers in place, which are then broadcast. Collective.
void load_full_state(torch::nn::Module& module, const ProcessGroup& group, const std::string& path);

}  // namespace cpprun::detail
