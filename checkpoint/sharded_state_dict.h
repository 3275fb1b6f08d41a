// State dicts in Hugging Face's sharded layout (support/safetensors_index.h): a directory of
// model-0000R-of-0000N.safetensors files holding whole tensors, and model.safetensors.index.json.
// Saved in parallel (each rank writes the contiguous run of tensors it owns, about 1/N of the
// bytes; rank 0 the index last); loaded by one process, which checks that the index and the
// files agree and come from one save before anything is copied (a wrapper's team reads the
// files on every rank in parallel: checkpoint/directory_read.h).
#pragma once

#include <torch/nn/module.h>

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "checkpoint/checkpoint_team.h"
#include "cpprun/checkpoint_file.h"
#include "cpprun/state_dict_options.h"
#include "support/safetensors_index.h"
#include "support/torch_save_file.h"

namespace cpprun::detail {

struct RowsInPlace;  // checkpoint/rows_in_place.h

// Whether PATH means the sharded layout: it ends in '/', is an existing directory, or names a
// model.safetensors.index.json.
bool is_sharded_state_dict_path(const std::string& path);
// The directory a sharded path names: PATH itself, or the directory of the STEM index it names.
std::string sharded_directory_of(const std::string& path, std::string_view stem);

// What every file of one save records.
struct ShardedSaveStamp {
  std::string save_id;           // random per save (or the caller's), the same in every file and the index
  std::optional<int64_t> step;
  std::map<std::string, std::string> metadata;  // more for every file and the index (an optimizer's kind)
};
std::string new_save_id();  // 32 random hex digits

// The steps of a save of `state` (the same on every rank) by `world` ranks, for the collective
// below and for tests that play several ranks in one process. `stem` names the files: "model"
// (model-0000R-of-0000N.safetensors, model.safetensors.index.json) or "optimizer" for an
// optimizer's state saved beside a model's; a save of one stem never touches the other's files. write_state_dict_shard: rank
// `rank`'s file, if it owns any tensor (with fewer tensors than ranks, some own none).
// write_state_dict_index: the index, once every file is in place; it also removes the shard files
// and the model.safetensors an earlier save left in DIR, which transformers would otherwise load
// or which would mix with this save.
void write_state_dict_shard(const NamedTensors& state, const std::string& dir, int rank, int world,
                            const ShardedSaveStamp& stamp, std::string_view stem = kModelStem);
// The same in two steps, for a save that copies only its own share (checkpoint/async_save.h): rank
// `rank`'s tensors and file name (empty when it owns none), then that file written to DIR.
struct StateDictShard {
  NamedTensors tensors;
  std::string file;
};
StateDictShard state_dict_shard(const NamedTensors& state, int rank, int world, std::string_view stem = kModelStem);
void write_state_dict_shard(const StateDictShard& shard, const std::string& dir, const ShardedSaveStamp& stamp);
// The files a save of `state` by `world` writers makes: min(world, tensors), none for no tensor.
int shard_file_count(const NamedTensors& state, int world);
// state_dict_shard for one owner of a save that several owners make, each of its own tensors
// (checkpoint/owned_state.h: pipeline stages): the owner's files are numbered after the
// `files_before` of the owners before it, among `files_in_all`.
StateDictShard state_dict_shard(const NamedTensors& state, int rank, int world, std::string_view stem,
                                int files_before, int files_in_all);
// Refuses a path naming the index file itself, which a save cannot take.
void check_sharded_save_path(const std::string& dir);
void write_state_dict_index(const NamedTensors& state, const std::string& dir, int world,
                            const ShardedSaveStamp& stamp, std::string_view stem = kModelStem);
// What that index names: each tensor's file, and the bytes of all; for a save that writes the
// index later (checkpoint/async_save.h), from shapes alone.
struct IndexPlan {
  std::map<std::string, std::string> weight_map;  // tensor -> file
  std::uint64_t total_bytes = 0;
};
IndexPlan index_plan(const NamedTensors& state, int world, std::string_view stem = kModelStem);
// The index of a save whose files `weight_map` names (tensor -> file), `total_bytes` in all,
// written once every file is in place, and the cleaning of what an earlier save left, as above.
void write_state_dict_index(std::map<std::string, std::string> weight_map, std::uint64_t total_bytes,
                            const std::string& dir, const ShardedSaveStamp& stamp, std::string_view stem);

// Creates the checkpoint directory DIR (and its parents) if need be; throws std::system_error
// naming DIR and the system's reason ("cpprun: cannot create the checkpoint directory ...").
void create_checkpoint_directory(const std::string& dir);

// A save written in place (checkpoint/rows_in_place.h): the root's token for its temporary files
// and the metadata its files' headers record (`stamp`'s: the save id, the step, an optimizer's
// groups), broadcast, so that every rank lays the files out alike. Collective over `team`; when the
// root cannot draw the token, every rank throws (`what` names the save).
struct InPlaceStamp {
  std::string token;
  std::map<std::string, std::string> metadata;
};
InPlaceStamp in_place_stamp(const CheckpointTeam& team, const ShardedSaveStamp& stamp, const std::string& what);

// Writes `state` (the same on every rank) to DIR as STEM's files: collective over `team` (alone:
// this process), each writer its share, the root the index last, with the root's save id
// (checkpoint/save_ids.h: options.save_id(), else joining this directory's last save or drawn); a
// failure on any rank is raised on every rank, after each rank removed the file it wrote.
// `in_place` (gather_for_writers's): the tensors each rank writes its rows of into the writers'
// files (checkpoint/rows_in_place.h), meta tensors in `state`.
void save_sharded_tensors(const NamedTensors& state, const CheckpointTeam& team, const std::string& dir,
                          const StateDictSaveOptions& options, std::string_view stem,
                          const std::map<std::string, std::string>& metadata = {},
                          const RowsInPlace* in_place = nullptr);

// A sharded directory's tensors as read and checked (CRCs, the index against its files, one save
// id), or a CorruptCheckpointError listing every fault.
struct ShardedDirectory {
  std::string index_path;
  SafetensorsIndex index;
  NamedTensors tensors;
  std::map<std::string, std::string> file_of;  // tensor name -> its file
  std::map<std::string, std::string> metadata;  // the first file's __metadata__
};
// The index at PATH, read and parsed: one larger than kMaxSafetensorsIndexBytes, or damaged, is a
// CorruptCheckpointError naming it; one that cannot be opened, std::system_error.
SafetensorsIndex read_index_file(const std::string& path);
// Its text alone, refused as read_index_file refuses it before it is read whole (for a reader that
// sends it on before parsing it).
std::string read_index_text(const std::string& path);
// `wanted` (null: all): read only the files that hold one of these names (the index's every file
// must still exist), for a rank that loads a part of the model (a pipeline stage).
ShardedDirectory read_sharded_directory(const std::string& dir, std::string_view stem,
                                        const std::set<std::string>* wanted = nullptr);
// The pieces of read_sharded_directory that a load reading the files on several ranks
// (checkpoint/parallel_load.h) shares: the index's files, each with the tensors it places there;
// the error for files the directory lacks (`absent`, of `promised`, in its order), and for the
// faults of sharded_directory_faults.
std::map<std::string, std::vector<std::string>> files_of_index(const SafetensorsIndex& index);
CorruptCheckpointError absent_files_error(const std::string& index_path, const std::string& dir,
                                          const std::map<std::string, std::vector<std::string>>& promised,
                                          const std::vector<std::string>& absent);
CorruptCheckpointError directory_faults_error(const std::string& dir, const std::vector<std::string>& faults);

// The directory a load of PATH (DIR, or the index it names) reads; `single` becomes
// DIR/model.safetensors when DIR holds that file alone, or DIR/pytorch_model.bin when it holds no
// safetensors (load it as a file). Refuses a DIR holding
// both that file and the index, or neither, as load_state_dict does.
std::string sharded_load_directory(const std::string& path, std::string& single);

// Reads DIR (or the index PATH names; a DIR holding only model.safetensors loads that file) into
// `into` (module_state(module) for a module) in place, strict as load_state_dict. This process alone.
StateDictLoadReport load_sharded_state_dict(const NamedTensors& into, const std::string& path,
                                            const StateDictOptions& options);

}  // namespace cpprun::detail
