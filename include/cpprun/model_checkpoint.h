// Two earlier checkpoint formats, kept so that their files still load, for a plain module or any
// wrapper (a DistributedDataParallel, a FullyShardedDataParallel, the cpprun::DataParallel made
// from either), with or without tensor parallelism. They run through the same state view as the
// state dicts of cpprun/state_dict.h (checkpoint/state_view.h), so every layout writes the same
// files and loads every other's. A wrapper: collective, every rank calls them. Files are written
// atomically with a checksum (cpprun/checkpoint_file.h), verified on load: a damaged file is
// refused with an error naming it, on the rank that read it, and every other rank throws too.
//
//   cpprun::save_full_state_dict(model, "model.pt");    // a plain Net loads it: torch::load(net, "model.pt")
//   cpprun::save_sharded_checkpoint(model, opt, "ckpt/");  // rank_<r>.pt: each FSDP rank its rows, by name
//
// Superseded, and left synchronous: save_full_state_dict writes a TorchScript archive, which
// today's torch.load refuses by default; save_state_dict(model, "model.pt") writes the dict
// PyTorch reads. save_sharded_checkpoint's rank_<r>.pt files only cpprun reads, and they hold no
// buffers; save_state_dict + save_optimizer_state_dict to a directory (or save_state_dict(model,
// optimizer, "ckpt/")) are Hugging Face's layout, load at any layout too, and save in the
// background with save_async(model, optimizer, "ckpt/", "ckpt/"). Both wait for a pending
// save_async first. How to move a checkpoint to the current formats: docs/checkpoints.md.
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <string>

#include "cpprun/data_parallel.h"
#include "cpprun/state_dict.h"

namespace cpprun {
namespace detail {

// The module whose structure torch::save's archive follows: a wrapper's wrapped module.
template <typename Model>
const torch::nn::Module& unwrapped_module(Model& model) {
  if constexpr (DataParallelWrapper<Model>) {
    return *model->module();
  } else {
    return as_module(model);
  }
}

// checkpoint/full_state.cpp and checkpoint/sharded_checkpoint.cpp: the same code for every wrapper
// and for a module.
void save_model_archive(StateSource source, const torch::nn::Module& module, const std::string& path);
void load_model_archive(StateSource source, const torch::nn::Module& module, const std::string& path);
void save_rank_files(StateSource source, torch::optim::Optimizer& optimizer, const std::string& dir);
void load_rank_files(StateSource source, torch::optim::Optimizer& optimizer, const std::string& dir);

}  // namespace detail

// The full model in torch::save's format for the unwrapped module: a plain module of the same type
// loads it with torch::load(module, path). Every tensor whole, under the unsplit module's names:
// FSDP's rows and tensor-parallel shards are gathered, and under mixed precision the fp32 masters
// are saved (not the compute copies). A wrapper: the first rank writes it.
template <typename Model>
void save_full_state_dict(Model&& model, const std::string& path) {
  detail::finish_previous_save();
  detail::save_model_archive(detail::state_source(model), detail::unwrapped_module(model), path);
}
// The reverse: a file written by torch::save(module, path) or save_full_state_dict, into any
// layout. A wrapper: only the first rank reads it; the values are broadcast and each rank keeps
// its part (FSDP its rows, tensor parallelism its shard). A file lacking one of the module's
// tensors, or holding one of another shape, is refused on every rank, listing each, and nothing
// changes.
template <typename Model>
void load_full_state_dict(Model&& model, const std::string& path) {
  detail::load_model_archive(detail::state_source(model), detail::unwrapped_module(model), path);
}

// The sharded checkpoint: DIR/rank_<q>.pt holds rows [q*C, q*C + C) of every trained parameter
// and their optimizer state (SGD, Adam, AdamW), keyed by the parameter's name, C = ceil(rows / W);
// DIR/meta.pt (names, shapes, W) is written last. Under FSDP, W is the shard group's size and each
// rank writes its own rows, in parallel (HSDP: the first replica); a model holding its parameters
// whole (DDP, a plain module) writes one file, W = 1; tensor-parallel splits are gathered, and the
// first rank of each tensor-parallel group writes. It loads at any world size, ZeRO stage, unit
// plan and {dp, tp} layout: the saved rows are cut anew; a model whose trained parameters' names or
// shapes differ is refused, listing every difference. Every file, meta.pt too, records the save's
// id: a directory mixing files of two saves (one rank's file from an older one) is refused on
// every rank, naming each such file (cpprun::CorruptCheckpointError); files of earlier versions,
// none with an id, still load. A save that fails on any rank removes the rank files it wrote and
// writes no meta.pt. Buffers are not in these files (save_state_dict holds them).
template <typename Model>
void save_sharded_checkpoint(Model&& model, torch::optim::Optimizer& optimizer, const std::string& dir) {
  detail::finish_previous_save();
  detail::save_rank_files(detail::state_source(model), optimizer, dir);
}
template <typename Model>
void load_sharded_checkpoint(Model&& model, torch::optim::Optimizer& optimizer, const std::string& dir) {
  detail::load_rank_files(detail::state_source(model), optimizer, dir);
}

}  // namespace cpprun
