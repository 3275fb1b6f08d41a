// See save_files.h.
#include "checkpoint/save_files.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <exception>

#include "core/failure_agreement.h"
#include "cpprun/atomic_file.h"
#include "cpprun/detail/replaced_files.h"

namespace cpprun::detail {

// Note [A trainer's files in the save]
// A training loop saves its model and optimizer, then where it stood (train_gpt's trainer.json:
// the step, the data order's position, the save id it belongs to). Written after the pair's save
// had ended, a kill or a full disk between the two left a whole new model and optimizer beside the
// earlier trainer.json, which a resume refuses (another save id), with the earlier model and
// optimizer already gone: no checkpoint to resume from. Written by the save's root inside the
// pair's ReplacedFiles scope, the file is one more part of the save: a failure puts back the
// earlier model, optimizer and trainer file together, and a kill before the ranks agree leaves
// each replaced file as NAME.prev, which the refusing load names with the command that puts the
// earlier checkpoint back (interrupted_save_note). DCP's equivalent is a non-tensor entry of the
// state dict (torchtitan's train_state); a file of its own keeps it readable by anything.

void check_save_file_name(const std::string& name) {
  const auto starts = [&](const char* prefix) { return name.rfind(prefix, 0) == 0; };
  const auto ends = [&](const std::string& suffix) {
    return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  const bool plain = std::none_of(name.begin(), name.end(), [](char c) {
    return c == '/' || static_cast<unsigned char>(c) < 0x20 || c == 0x7f;
  });
  TORCH_CHECK(!name.empty() && plain && name[0] != '.',
              "cpprun::save_state_dict(model, optimizer, DIR, options, files): \"", name, "\" is not a plain file "
              "name: each of `files` is written into DIR itself, so name it without a directory, without control "
              "characters and not starting with a dot (e.g. \"trainer.json\").");
  // NAME.prev must fit a file name too (255 bytes on Linux's filesystems), or a failed save could
  // not put the earlier file back.
  TORCH_CHECK(name.size() <= kMaxSaveFileName, "cpprun::save_state_dict(model, optimizer, DIR, options, files): a "
              "name of ", name.size(), " bytes (\"", name.substr(0, 40), "...\") is too long: at most ",
              kMaxSaveFileName, ", so that the save can keep the earlier file as NAME.prev.");
  TORCH_CHECK(!starts("model.") && !starts("model-") && !starts("optimizer.") && !starts("optimizer-") &&
                  !ends(".tmp") && !ends(".prev"),
              "cpprun::save_state_dict(model, optimizer, DIR, options, files): \"", name, "\" is a name the save "
              "uses for its own files (model.*, model-*, optimizer.*, optimizer-*, *.tmp, *.prev); choose another "
              "(e.g. \"trainer.json\").");
}

void check_save_files(const CheckpointTeam& team, const ProcessGroup* owners,
                      const std::map<std::string, std::string>& files) {
  std::exception_ptr failure;
  if (is_save_root(team, owners)) {
    try {
      for (const auto& [name, bytes] : files) check_save_file_name(name);
    } catch (...) {
      failure = std::current_exception();
    }
  }
  share_save_root_failure(team, owners, failure);
}

bool is_save_root(const CheckpointTeam& team, const ProcessGroup* owners) {
  return team.is_root() && (!owners || owners->rank() == 0);
}

void share_save_root_failure(const CheckpointTeam& team, const ProcessGroup* owners, std::exception_ptr failure) {
  // A pipeline: owner 0 tells the other owners (each its team's root, or none is:
  // check_roots_line_up in owned_state.cpp), then each root its team. Caught in between, so that
  // the roots' teams hear it too.
  if (owners) {
    try {
      share_root_failure(*owners, is_save_root(team, owners) ? failure : nullptr);
    } catch (...) {
      failure = std::current_exception();
    }
  }
  team.share_root_failure(team.is_root() ? failure : nullptr);
  // A rank that heard it over the owners but is not its team's root (teams laid out otherwise
  // from stage to stage, which a later check refuses) throws too, rather than go on alone.
  if (failure) std::rethrow_exception(failure);
}

void write_save_files(const CheckpointTeam& team, const ProcessGroup* owners, const std::string& dir,
                      const std::map<std::string, std::string>& files) {
  std::exception_ptr failure;
  if (is_save_root(team, owners)) {
    try {
      for (const auto& [name, bytes] : files) {  // names checked by check_save_files, before the save
        const std::string path = dir + name;
        note_replacing(path);  // Note [A failed save puts the previous files back]
        write_file_atomically(path, bytes);
        note_replaced(path);
      }
    } catch (...) {
      failure = std::current_exception();
    }
  }
  share_save_root_failure(team, owners, failure);
}

}  // namespace cpprun::detail
