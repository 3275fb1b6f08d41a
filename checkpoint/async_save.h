// Asynchronous state-dict saves (cpprun::save_async, cpprun/state_dict.h): the state is copied
// to CPU memory on the calling thread, then written on a background thread; the handle
// (cpprun/async_save.h) waits for it. See Note [Asynchronous save across ranks] in the .cpp.
#pragma once

#include <torch/nn/module.h>

#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "checkpoint/checkpoint_team.h"
#include "checkpoint/rows_in_place.h"
#include "checkpoint/sharded_state_dict.h"
#include "cpprun/async_save.h"
#include "cpprun/process_group.h"
#include "cpprun/state_dict_options.h"
#include "support/safetensors_index.h"
#include "support/torch_save_file.h"

namespace cpprun::detail {

// One set of files of a save: a model's state dict (STEM "model") or an optimizer's state
// ("optimizer", with its kind and param groups in `metadata`), to a file or a directory.
struct AsyncSavePart {
  // Whole tensors, the same on every rank of the team; what a rank writes is copied before the
  // save returns.
  NamedTensors state;
  // `state` is a directory's as gather_for_writers gives it with WholeTensors::kOwned: whole only
  // on its writers (a meta tensor of its shape elsewhere, and everywhere for FSDP's rows), and the
  // save's own, so only a tensor not in CPU memory is copied.
  bool owned = false;
  // A directory's tensors that FSDP shards by rows (meta tensors in `state`), each rank's rows
  // written in place by it (gather_for_writers fills it): copied before the save returns, by
  // every rank.
  RowsInPlace rows;
  std::string path;
  std::string_view stem = kModelStem;
  std::map<std::string, std::string> metadata;
};

// Starts saving `parts` (each as save_state_dict / save_optimizer_state_dict would) on one
// background thread, under one save id, which every file records when there is more than one
// part (else, as the synchronous save, a file only when options.save_id() is given). Collective
// over `team` (alone: this process): the save id is broadcast here, and each writer copies only
// what it writes (a file: the root all of it; a directory: its share; FSDP's rows: every rank its
// own, Note [An asynchronous save in place] in the .cpp); the other ranks copy nothing and learn
// the result. Registers the save as this process's latest (see
// finish_previous_save in cpprun/state_dict.h).
AsyncSave start_async_save(std::vector<AsyncSavePart> parts, const CheckpointTeam& team,
                           const StateDictSaveOptions& options);
// One part: whole tensors (the same on every rank), copied before it returns.
AsyncSave start_async_save(const NamedTensors& state, const CheckpointTeam& team, const std::string& path,
                           const StateDictSaveOptions& options);

// CPU copies of `state` that training cannot change: pinned host memory for a tensor on a GPU;
// a tensor listed under two names (tied weights) copied once, so files encode it as the original.
// `owned`: the CPU tensors of `state` are the save's own already (AsyncSavePart::owned): kept as they are.
// A meta tensor (a name another rank writes) is kept as it is.
NamedTensors snapshot_state(const NamedTensors& state, bool owned = false);
// One tensor's copy, as snapshot_state makes it.
at::Tensor snapshot_tensor(const at::Tensor& tensor);

// ---- The background half, for a save whose collectives its caller ran (start_async_save above,
// and the save of several owners, checkpoint/owned_state.h).

// One part as this rank writes it, every tensor already copied.
struct PreparedPart {
  std::string path;
  bool directory = false;
  std::string_view stem = kModelStem;
  ShardedSaveStamp stamp;                        // a directory: the save id, step and the part's metadata
  bool writes_file = false;                      // a file: this rank writes it
  NamedTensors file_state;                       //   ... all of it
  std::map<std::string, std::string> metadata;   //   ... with this in its header
  StateDictShard shard;                          // a directory: this rank's share (no file: none)
  // A directory whose rows every rank writes in place (then `shard` is unused): its files created,
  // the shared blocks sent, on the calling thread; write() and finish() are the thread's.
  std::shared_ptr<ShardsInPlace> in_place;
  std::exception_ptr failed;  // ... or why they could not be (every rank's, agreed), for the thread to raise
  bool failed_here = false;   // `failed` is this rank's own error (else another rank's, which says why)
  bool writes_index = false;                     // a directory: this rank writes the index, last
  IndexPlan index;
};

// PART's path, kind, stem and stamp (`save_id`, `step`, its metadata); nothing to write yet.
PreparedPart prepared_part(const AsyncSavePart& part, const std::string& save_id, std::optional<int64_t> step);

// Who takes part, and how they tell each other (Note [Asynchronous save across ranks]).
struct AsyncSaveRanks {
  CheckpointTeam team;
  // Teams that each save their own tensors (pipeline stages): the group of the teams' roots, whose
  // rank 0 writes a file or the index. None: one team saves everything.
  std::optional<ProcessGroup> owners;
  std::string token;     // this save's keys in the groups' stores; the same on every rank
  std::string save_id;
  bool drew_id = false;  // this rank claimed the save id in its directories' memory (checkpoint/save_ids.h)
};

// Writes `parts` on a background thread, as Note [Asynchronous save across ranks] says, and
// registers the save as this process's latest. `file_options`: a file's save id and step.
AsyncSave launch_async_save(std::vector<PreparedPart> parts, AsyncSaveRanks ranks,
                            const StateDictSaveOptions& file_options);

// The save id of `parts`, on the rank that draws it: as a synchronous save's into their directory
// (checkpoint/save_ids.h) when the parts' directories are one, so that an asynchronous model save
// and a later optimizer save there join; else the given id or a new one, remembered in each directory.
std::string claim_parts_save_id(const std::vector<AsyncSavePart>& parts, const StateDictSaveOptions& options);

}  // namespace cpprun::detail
