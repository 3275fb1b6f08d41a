// save_sharded_checkpoint's files (cpprun/model_checkpoint.h), an earlier format kept so that its
// checkpoints load, written and read through the state view (checkpoint/state_view.h). W files
// DIR/rank_<q>.pt, q < W, each holding rows [q*C, q*C + C) of dim 0 of every trained parameter's
// whole tensor (C = ceil(rows / W); the last files hold fewer, or none) and the optimizer's state
// of those rows (SGD, Adam, AdamW), keyed by the parameter's name; then DIR/meta.pt (the names,
// whole shapes, W), written last, so that its presence marks a complete checkpoint. Every file,
// meta.pt too, records the save's id. Under FSDP W is the shard group's size and file q is shard
// rank q's rows as they are: FSDP's own format, unchanged. A model that holds its parameters whole
// (DDP, a plain module) writes one file; a tensor-parallel split is gathered and its rows cut the
// same way. Loading cuts each rank's part of the saved rows at any W, so every layout loads every
// other's. Not in the files: buffers and frozen parameters (FSDP's format never held them).
#pragma once

#include <torch/optim/optimizer.h>

#include <string>

#include "checkpoint/state_view.h"

namespace cpprun::detail {

// The writers are the first rank holding each q (under HSDP, one replica); `optimizer` may be
// null. Collective over the view's team; when any rank fails, each removes the file it wrote and
// meta.pt is not written.
void save_sharded_checkpoint(const StateView& view, torch::optim::Optimizer* optimizer, const std::string& dir);
// Fills each entry's local tensor (and the optimizer's state for it) from DIR; each rank reads the
// files holding its rows only (every file for a whole or tensor-parallel tensor). A model whose
// names or shapes differ is refused, listing every difference; a file whose save id differs from
// meta.pt's (files of two saves; one with an id and one without) is refused on every rank alike,
// naming it (CorruptCheckpointError); files of earlier versions, none with an id, load. Every file
// is opened and checked before anything changes. Collective over the view's team.
void load_sharded_checkpoint(const StateView& view, torch::optim::Optimizer* optimizer, const std::string& dir);

}  // namespace cpprun::detail
