// State dicts by name (cpprun/state_dict.h): a module's parameters and buffers under PyTorch's
// state_dict() names, as .safetensors or .pt (torch.save's dict) by the file's extension; the
// comparison that strict loading decides on; and the collective versions DDP and FSDP call.
#pragma once

#include <torch/nn/module.h>

#include <string>

#include "cpprun/process_group.h"
#include "cpprun/state_dict_options.h"
#include "support/torch_save_file.h"

namespace cpprun::detail {

// The module's parameters then buffers, recursively, by name ("0.weight", "1.running_mean"); a
// tied tensor under each of its names, as Python's state_dict() lists it.
NamedTensors module_state(torch::nn::Module& module);

// What differs between the module's tensors and the file's (names, shapes, dtypes).
StateDictLoadReport compare_state(const NamedTensors& module, const NamedTensors& file);

// The file's bytes for `tensors`, in the format PATH's extension names (.safetensors, .pt, .pth).
std::string encode_state_dict(const NamedTensors& tensors, const std::string& path);
// The tensors in a file's bytes (CPU), by PATH's extension.
NamedTensors decode_state_dict(std::string_view bytes, const std::string& path);

// One process: writes PATH atomically / reads it into `module` in place. A strict load that finds
// differences throws StateDictMismatchError and changes nothing.
void save_state_dict_file(torch::nn::Module& module, const std::string& path);
StateDictLoadReport load_state_dict_file(torch::nn::Module& module, const std::string& path,
                                         const StateDictOptions& options);

// Collective: rank 0 writes (reads, then broadcasts the module's state); a failure on rank 0 is
// raised on every rank. The report is the same on every rank.
void save_state_dict(torch::nn::Module& module, const ProcessGroup& group, const std::string& path);
StateDictLoadReport load_state_dict(torch::nn::Module& module, const ProcessGroup& group, const std::string& path,
                                    const StateDictOptions& options);

}  // namespace cpprun::detail
