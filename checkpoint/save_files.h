// Files of a checkpoint beside its tensors: what a training loop keeps of where it stood (its
// step, the data's position, a trainer.json), written within the save of the model and its
// optimizer, so that they succeed or fail together (Note [A trainer's files in the save] in the
// .cpp), and the checks a pair load makes once for all ranks. Users reach this through
// save_state_dict(model, optimizer, DIR, options, files) and load_state_dict(model, optimizer, DIR).
#pragma once

#include <cstddef>
#include <exception>
#include <map>
#include <string>

#include "checkpoint/checkpoint_team.h"
#include "cpprun/process_group.h"

namespace cpprun::detail {

// The one rank of a save that writes what is written once (an index, a trainer's file) and reads
// what is checked once: the team's root; with `owners` (a pipeline's ranks, each its stages'
// team's root or none), the one of owner 0.
bool is_save_root(const CheckpointTeam& team, const ProcessGroup* owners);
// That rank's error (null: none; ignored elsewhere) thrown on every rank of the team and the
// owners, of its kind and with its message. Collective.
void share_save_root_failure(const CheckpointTeam& team, const ProcessGroup* owners, std::exception_ptr failure);

// Refuses, on every rank, a model's and an optimizer's paths whose save ids differ (Note [A pair
// of files from one save] in checkpoint.cpp), before either is loaded. Collective.
void check_one_save(const CheckpointTeam& team, const ProcessGroup* owners, const std::string& model_path,
                    const std::string& optimizer_path);

// Refuses a name that is not a plain file name in the directory (a path, ".", "..", a hidden
// name, control characters, longer than kMaxSaveFileName), or that names a file of the save itself
// (model.*, model-*, optimizer.*, optimizer-*) or of its bookkeeping (*.tmp, *.prev); says what to
// use instead.
constexpr std::size_t kMaxSaveFileName = 250;  // NAME.prev within Linux's 255-byte names
void check_save_file_name(const std::string& name);
// The root's names checked before the save writes anything, the verdict on every rank.
// Collective, as write_save_files.
void check_save_files(const CheckpointTeam& team, const ProcessGroup* owners,
                      const std::map<std::string, std::string>& files);

// The save's root (the team's root; with `owners`, a pipeline's, the one of owner 0) writes each
// of `files` (name -> bytes, their names passed by check_save_files before the save began) into
// `dir` (ending in '/'), atomically, in this thread's ReplacedFiles scope; the others write
// nothing. Collective over the team (and `owners`): the root's error is thrown on every rank alike.
void write_save_files(const CheckpointTeam& team, const ProcessGroup* owners, const std::string& dir,
                      const std::map<std::string, std::string>& files);

}  // namespace cpprun::detail
