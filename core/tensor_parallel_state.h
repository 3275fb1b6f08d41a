// State dict files for a model holding tensor-parallel shards (cpprun/tensor_parallel_split.h):
// the file holds the whole tensors under their unsplit names, as the same model before
// parallelize_module would save them, so it loads into an unsplit model, into PyTorch, or back
// into a model split any other way.
#pragma once

#include <torch/nn/module.h>

#include <map>
#include <string>

#include "cpprun/process_group.h"
#include "cpprun/state_dict_options.h"
#include "cpprun/tensor_parallel_split.h"
#include "support/torch_save_file.h"

namespace cpprun::detail {

// The whole tensor of which `shard` is this rank's part. Collective over split.group.
at::Tensor gather_tensor_parallel_split(const at::Tensor& shard, const TensorParallelSplit& split);
// This rank's part of `whole` (a copy): chunk r of each of split.parts blocks along split.dim.
at::Tensor tensor_parallel_shard(const at::Tensor& whole, const TensorParallelSplit& split);

// Collective over every tensor-parallel group of `splits` and over `data_parallel` (null: none):
// every split tensor is gathered, the one rank first in all of them writes PATH (a .safetensors or
// .pt file, atomically), and every rank learns whether it failed. Under FSDP the full parameters
// must be current (gather_full_parameters). A directory (the sharded layout) is refused.
void save_tensor_parallel_state_dict(torch::nn::Module& module, const ProcessGroup* data_parallel,
                                     const std::map<std::string, TensorParallelSplit>& splits, const std::string& path,
                                     const StateDictSaveOptions& options);

// Every rank reads PATH (whole tensors; it must be readable on every rank), cuts its shard of each
// split one, and loads by name as load_state_dict does (strict: a name, a whole shape or a dtype
// that differs changes nothing and throws). Collective as the save, so that a rank's failure is
// every rank's error rather than the others' wait.
StateDictLoadReport load_tensor_parallel_state_dict(torch::nn::Module& module, const ProcessGroup* data_parallel,
                                                    const std::map<std::string, TensorParallelSplit>& splits,
                                                    const std::string& path, const StateDictOptions& options);

}  // namespace cpprun::detail
