// save_full_state_dict's file (cpprun/model_checkpoint.h), an earlier format kept so that its
// files load: the archive torch::save(module) writes (a TorchScript module per submodule, holding
// its parameters and buffers by their own names), here with every tensor's whole value, gathered
// through the state view (checkpoint/state_view.h). So any wrapper and any split (FSDP's rows,
// tensor-parallel shards, mixed precision's fp32 masters) writes what torch::save of the unsplit
// module writes, and a plain module of the same type loads it with torch::load(module, path).
#pragma once

#include <torch/nn/module.h>

#include <string>

#include "checkpoint/state_view.h"

namespace cpprun::detail {

// `module`: the unwrapped module, whose structure the archive follows (as Module::save walks it:
// its parameters, its buffers, then each serializable child's archive); the view's entries are its
// tensors by name. The team's root writes PATH atomically with cpprun's checksum footer, which
// torch::load ignores; a failure is raised on every rank. Collective over the view's team.
void save_full_state(const StateView& view, const torch::nn::Module& module, const std::string& path);

// The team's root reads PATH (written by save_full_state or by torch::save(module), unchecked
// then) by the module's structure: every parameter and buffer must be there with its whole shape,
// else nothing changes and the load is refused on every rank, listing each difference. The values
// are broadcast and each rank keeps its part. Names the archive holds beyond the module's are
// ignored, as torch::load ignores them. Collective over the view's team.
void load_full_state(const StateView& view, const torch::nn::Module& module, const std::string& path);

}  // namespace cpprun::detail
