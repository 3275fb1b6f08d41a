// Checkpoints of a wrapped model, written once for any wrapper: a DistributedDataParallel, a
// FullyShardedDataParallel, or the cpprun::DataParallel made from either. Collective: every rank
// calls them. Files are written atomically with a checksum (cpprun/checkpoint_file.h), verified
// on load: a damaged file is refused with an error naming it, on the rank that read it, and
// every other rank throws too.
//
//   cpprun::save_full_state_dict(model, "model.pt");    // a plain Net loads it: torch::load(net, "model.pt")
//   cpprun::save_sharded_checkpoint(model, opt, "ckpt/");  // FSDP: each rank its rows, by parameter name
//
// Earlier formats, kept so that their files still load, and left synchronous: the state dicts of
// cpprun/state_dict.h and cpprun/optimizer_state_dict.h supersede them. save_full_state_dict
// writes a TorchScript archive, which today's torch.load refuses by default; save_state_dict(model,
// "model.pt") writes the dict PyTorch reads. save_sharded_checkpoint's rank_<r>.pt files only
// cpprun reads; save_state_dict + save_optimizer_state_dict to a directory are Hugging Face's
// layout, load at any world size and stage too, and save in the background with
// save_async(model, optimizer, "ckpt/", "ckpt/"). Both wait for a pending save_async first.
#pragma once

#include <torch/optim/optimizer.h>

#include <string>

#include "cpprun/data_parallel.h"
#include "cpprun/state_dict.h"

namespace cpprun {

// The full model, in torch::save's format for the wrapped module: a plain, unwrapped module of
// the same type loads it with torch::load(module, path). Rank 0 writes it (FSDP gathers first).
template <typename Wrapper>
  requires requires(Wrapper& w) { detail::DataParallelAccess::core(*w); }
void save_full_state_dict(Wrapper& model, const std::string& path) {
  detail::finish_previous_save();
  detail::DataParallelAccess::core(*model).save_full_state(path);
}
// The reverse: a file written by torch::save(module, path) or save_full_state_dict. Only rank 0
// reads it; the values are broadcast (FSDP: each rank keeps its rows).
template <typename Wrapper>
  requires requires(Wrapper& w) { detail::DataParallelAccess::core(*w); }
void load_full_state_dict(Wrapper& model, const std::string& path) {
  detail::DataParallelAccess::core(*model).load_full_state(path);
}

// FSDP's sharded checkpoint: each rank writes DIR/rank_<r>.pt with its rows of every parameter
// and their optimizer state (SGD, Adam, AdamW), keyed by the parameter's name, in parallel; rank
// 0 writes DIR/meta.pt (names, shapes, world size) last. Under HSDP only the first replica
// writes, r being the rank in the shard group, and every replica loads. It loads at any world
// size and with any unit plan: the saved rows are cut anew; a model whose names or shapes differ
// is refused, listing every difference. Every file, meta.pt too, records the save's id: a
// directory mixing files of two saves (one rank's file from an older one) is refused on every
// rank, naming each such file (cpprun::CorruptCheckpointError); files of earlier versions, none
// with an id, still load. A save that fails on any rank removes the rank files it wrote and
// writes no meta.pt. DDP: an error (use the full state).
template <typename Wrapper>
  requires requires(Wrapper& w) { detail::DataParallelAccess::core(*w); }
void save_sharded_checkpoint(Wrapper& model, torch::optim::Optimizer& optimizer, const std::string& dir) {
  detail::finish_previous_save();
  detail::DataParallelAccess::core(*model).save_sharded(dir, &optimizer);
}
template <typename Wrapper>
  requires requires(Wrapper& w) { detail::DataParallelAccess::core(*w); }
void load_sharded_checkpoint(Wrapper& model, torch::optim::Optimizer& optimizer, const std::string& dir) {
  detail::DataParallelAccess::core(*model).load_sharded(dir, &optimizer);
}

}  // namespace cpprun
