// A sharded directory (Hugging Face's layout, checkpoint/sharded_state_dict.h) read by a team's
// writers, each its share of the files (checkpoint/reader_report.h: file i by writer i mod W),
// checked as read_sharded_directory checks it, with the verdict the same on every rank: the
// loads of a model (checkpoint/parallel_load.h) and of an optimizer's state build on it. See
// Note [Reading a directory on every rank] in parallel_load.cpp.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "checkpoint/checkpoint_team.h"
#include "checkpoint/reader_report.h"
#include "support/safetensors_index.h"

namespace cpprun::detail {

// info_of points into reports: move it, never copy it.
struct TeamDirectoryRead {
  std::string dir;
  std::string index_path;
  SafetensorsIndex index;
  std::vector<std::string> files;                      // the index's files, by name
  std::vector<ReaderReport> reports;                   // every writer's, in writer order
  std::map<std::string, const ReadFileInfo*> info_of;  // file -> what it holds (into `reports`)
};

// Collective over `team`. `index_text`: DIR/STEM.safetensors.index.json's text, the same on every
// rank (the root read it; it parses). `wants_crc`: the names (as the files name them) whose
// values' CRC-32 the readers report. Throws on every rank alike, before returning to any: the
// files the directory lacks (every one, as read_sharded_directory lists them); a reader's own
// error (a damaged file), that reader raising it and the others the same with "(raised on rank
// R)"; the faults of sharded_directory_faults.
TeamDirectoryRead read_directory_on_writers(const CheckpointTeam& team, const std::string& dir, std::string_view stem,
                                            const std::string& index_text,
                                            const std::function<bool(const std::string&)>& wants_crc);

}  // namespace cpprun::detail
