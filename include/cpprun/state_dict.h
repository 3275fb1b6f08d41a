// State dicts by parameter name, in files PyTorch and Hugging Face read, for a plain module or any
// DataParallel wrapper. The format follows the path:
//   .safetensors   Hugging Face's safetensors (safetensors.torch.load_file, transformers)
//   .pt / .pth     torch.save's dict of tensors (torch.load(path), default weights_only=True)
//   DIR/           (a path ending in '/', or an existing directory) Hugging Face's sharded layout,
//                  what save_pretrained writes and from_pretrained reads: model-0000R-of-0000N
//                  .safetensors files of whole tensors plus model.safetensors.index.json. A wrapper
//                  saves in parallel: each rank writes one file, about 1/N of the bytes. Loading
//                  reads DIR/model.safetensors.index.json (the path may also name the index), or
//                  DIR/model.safetensors when DIR holds that alone; at any world size.
// The names are Python's model.state_dict() keys: parameters and buffers ("0.weight",
// "1.running_mean"), a tied weight under each of its names.
//
//   cpprun::save_state_dict(net, "model.safetensors");            // a module: this process alone
//   cpprun::save_state_dict(model, "model.pt");                   // DDP/FSDP: collective, rank 0 writes
//   cpprun::load_state_dict(net, "pytorch_model.pt");             // strict: one error lists every difference
//   cpprun::save_state_dict(model, "run/hf/", cpprun::StateDictSaveOptions().step(step));  // sharded
//   auto report = cpprun::load_state_dict(net, "f.safetensors", cpprun::StateDictOptions().strict(false));
//   auto pending = cpprun::save_async(model, "run/hf/");  // written in the background; pending.wait()
//
// Files are written atomically and carry a CRC-32 (.safetensors: in __metadata__; .pt: cpprun's
// footer, which torch.load ignores); a damaged file is refused, naming it. Files without one
// (written by Python) load unchecked. Every file of a sharded save carries one save id (and the
// step, when given): a model and its optimizer saved into one directory with the same options
// share it (cpprun/optimizer_state_dict.h); a directory whose files come from different saves, a
// file the index names but the directory lacks, or a file lacking a tensor the index places in it
// is refused, naming the file (cpprun::CorruptCheckpointError). A sharded save that fails on any
// rank (a full disk) removes the files it wrote, on every rank, and writes no index.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/ordered_dict.h>

#include <memory>
#include <string>
#include <type_traits>
#include <utility>

#include "cpprun/async_save.h"
#include "cpprun/data_parallel.h"
#include "cpprun/state_dict_options.h"

namespace cpprun {
namespace detail {

// Waits for this process's last save_async; raises its error if nobody has seen it yet.
void finish_previous_save();

template <typename Model>
concept DataParallelWrapper = requires(Model& model) { DataParallelAccess::core(*model); };

inline torch::nn::Module& as_module(torch::nn::Module& module) { return module; }
template <typename M>
torch::nn::Module& as_module(const std::shared_ptr<M>& module) {
  return *module;
}
template <typename M>
torch::nn::Module& as_module(const torch::nn::ModuleHolder<M>& holder) {
  return *holder.ptr();
}

// What a checkpoint saves and loads: a wrapper (whose core describes its state to the
// checkpoint code) or a plain module. One of the two is set.
struct StateSource {
  DataParallelCore* wrapper = nullptr;
  torch::nn::Module* module = nullptr;
};
template <typename Model>
StateSource state_source(Model& model) {
  if constexpr (DataParallelWrapper<Model>) {
    return {&DataParallelAccess::core(*model), nullptr};
  } else {
    return {nullptr, &as_module(model)};
  }
}

// checkpoint/checkpoint.cpp: the same code for every wrapper and for a module.
void save_model_state(StateSource source, const std::string& path, const StateDictSaveOptions& options);
StateDictLoadReport load_model_state(StateSource source, const std::string& path, const StateDictOptions& options);
AsyncSave save_model_state_async(StateSource source, const std::string& path, const StateDictSaveOptions& options);
torch::OrderedDict<std::string, at::Tensor> get_model_state(StateSource source, const StateDictOptions& options);
StateDictLoadReport set_model_state(StateSource source, const torch::OrderedDict<std::string, at::Tensor>& state,
                                    const StateDictOptions& options);

}  // namespace detail

// Writes the model's state dict to PATH. A DataParallel wrapper: collective, every rank calls it;
// rank 0 writes the wrapped module's state (FSDP gathers the full parameters first), or, to a
// directory, each rank writes its share of the tensors and rank 0 the index last. A module (a
// torch::nn::Module, a shared_ptr to one, or a module holder such as torch::nn::Linear): this
// process alone writes (a directory: one shard file and the index).
template <typename Model>
void save_state_dict(Model&& model, const std::string& path,
                     const StateDictSaveOptions& options = StateDictSaveOptions()) {
  detail::finish_previous_save();
  detail::save_model_state(detail::state_source(model), path, options);
}

// save_state_dict, with the writing on a background thread: returns once the state is copied to
// CPU memory (pinned host memory for tensors on a GPU), and training may change the model at
// once; the file (or directory) then holds the state as it was at the call. What is collective
// in save_state_dict (the save id; FSDP's gather for a file; for a directory, each writer's file
// created and the bytes where ranks' rows meet sent to it) happens here, on the calling thread;
// the background thread runs no collective. A save first waits for this process's previous one (and
// raises its error if nobody has seen it). See cpprun/async_save.h for the handle.
//
//   cpprun::AsyncSave pending = cpprun::save_async(model, "run/model.safetensors",
//                                                  cpprun::StateDictSaveOptions().step(step));
template <typename Model>
[[nodiscard]] AsyncSave save_async(Model&& model, const std::string& path,
                                   const StateDictSaveOptions& options = StateDictSaveOptions()) {
  detail::finish_previous_save();
  return detail::save_model_state_async(detail::state_source(model), path, options);
}

// Copies PATH's tensors into the model's parameters and buffers in place, by name; a file whose
// names, shapes or dtypes differ is refused (StateDictMismatchError, listing every difference,
// nothing loaded) unless options.strict(false), which loads what fits and reports the rest; from
// a directory, the error also names the file of each unexpected or mismatched tensor. A wrapper:
// collective; rank 0 reads (every file of a directory), the values are broadcast (FSDP: each
// rank keeps its rows), and every rank returns the same report or throws the same error.
template <typename Model>
StateDictLoadReport load_state_dict(Model&& model, const std::string& path,
                                    const StateDictOptions& options = StateDictOptions()) {
  return detail::load_model_state(detail::state_source(model), path, options);
}

// The model's state dict in memory, whole: PyTorch's get_model_state_dict(model,
// options=StateDictOptions(full_state_dict=True)). The names and order of Python's
// model.state_dict() (a tied tensor under each name), each tensor whole and detached: FSDP's rows
// and tensor-parallel splits gathered, mixed precision's fp32 masters rather than the compute
// copies. A tensor the model holds whole (DDP, buffers, a plain module) is the model's own, as
// state_dict() gives it; a gathered one is new memory, a whole copy on every rank unless
// options.cpu_offload(true) (rank 0 alone gets the tensors, on the CPU). A wrapper: collective,
// every rank calls it. PyTorch's default, full_state_dict=False, gives DTensor shards, which
// LibTorch lacks: a sharded checkpoint is save_state_dict to a directory.
//
//   auto state = cpprun::get_model_state_dict(model, cpprun::StateDictOptions().cpu_offload(true));
//   if (cpprun::rank() == 0) cpprun::set_model_state_dict(eval_net, state);  // a plain module: this process
template <typename Model>
torch::OrderedDict<std::string, at::Tensor> get_model_state_dict(Model&& model,
                                                                 const StateDictOptions& options = StateDictOptions()) {
  return detail::get_model_state(detail::state_source(model), options);
}

// Copies `state`'s whole tensors into the model in place, each rank keeping its part: PyTorch's
// set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True)). Checked
// as load_state_dict checks a file (strict by default: the names, shapes and dtypes must be the
// model's, else StateDictMismatchError lists every difference and nothing changes; strict(false)
// loads what fits and reports the rest; file_key_prefix as there). The tensors may be on any
// device. A wrapper: collective; every rank passes the whole dict and the ranks agree before any
// copies (one rank's mismatch stops all, unchanged), or with options.broadcast_from_rank0(true)
// rank 0's dict alone is read and broadcast.
template <typename Model>
StateDictLoadReport set_model_state_dict(Model&& model, const torch::OrderedDict<std::string, at::Tensor>& state,
                                         const StateDictOptions& options = StateDictOptions()) {
  return detail::set_model_state(detail::state_source(model), state, options);
}

}  // namespace cpprun
