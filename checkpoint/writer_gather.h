// A sharded save's whole tensors made only where they are written: each tensor FSDP shards by rows
// is gathered to the writer whose file holds it (checkpoint/writer_plan.h), not to every rank, so
// a rank's extra memory during the save is its own file's tensors and one tensor in flight, not
// the whole model (as PyTorch's DCP, whose ranks write what they hold). The files are the same
// bytes as when every rank gathers every tensor. See Note [Gathering to the writer].
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/checkpoint_team.h"
#include "checkpoint/state_view.h"
#include "support/torch_save_file.h"

namespace cpprun::detail {

struct RowsInPlace;  // checkpoint/rows_in_place.h

// One tensor of a save, as this rank holds it.
struct SavePiece {
  const StateEntry* entry = nullptr;  // how `local` is placed (its parameter's entry); null: whole everywhere
  at::Tensor local;                   // the entry's local tensor, or an optimizer state of its shape
};

// What the whole tensors a writer gets may share with the pieces' local tensors.
enum class WholeTensors {
  kMayShare,  // a piece held whole (replicated) is given as it is: a synchronous save writes it at once
  kOwned,     // none shares memory with a piece, so training may change the pieces while they are
              // written (an asynchronous save): a piece held whole is copied to the CPU (pinned host
              // memory from a GPU); a gathered one is already the save's own, left where it was made
};

// The tensors `names` (each name -> its piece, in the file's order) as a sharded save by `team`
// writes them: on a writer, the whole tensor of every name in its own file; every other name a
// tensor of its whole shape and dtype on the meta device (no memory), which the plan and the
// index read. Collective over the team and the pieces' groups, in one order on every rank; a
// failure to allocate on any rank is raised on every rank before the first gather (`what` names
// the save).
// `in_place`: the tensors FSDP shards by rows are not gathered but written in place, each rank
// its own rows (checkpoint/rows_in_place.h): they are meta tensors everywhere, and `in_place` says
// which, with this rank's parts: its local tensors themselves (with kOwned too: an asynchronous
// save copies them).
NamedTensors gather_for_writers(const std::vector<SavePiece>& pieces,
                                const std::vector<std::pair<std::string, std::size_t>>& names,
                                const CheckpointTeam& team, const std::string& what,
                                WholeTensors hold = WholeTensors::kMayShare, RowsInPlace* in_place = nullptr);

// The same for a view's state (whole_state's names and tensors).
NamedTensors gather_view_for_writers(const StateView& view, const std::string& what,
                                     WholeTensors hold = WholeTensors::kMayShare, RowsInPlace* in_place = nullptr);

// A view's state as a save to PATH writes it. A sharded directory: gather_view_for_writers's, each
// tensor whole only on its writers, and with two writers or more every replicated buffer the
// team root's (use_root_buffers: Note [A directory holds the root's buffers]); collective over the
// team. A file: whole_state's, whole on every rank (`hold` unused: the caller copies what it keeps).
NamedTensors state_to_save(const StateView& view, const std::string& path, WholeTensors hold,
                           RowsInPlace* in_place = nullptr);

}  // namespace cpprun::detail
