// A model's load from a sharded directory (Hugging Face's layout, checkpoint/sharded_state_dict.h)
// with the files read on every rank in parallel, as PyTorch's DCP reads: each writer of the
// view's team reads about 1/W of the files (checkpoint/reader_report.h), the team agrees that
// every file holds together and fits the model before any tensor changes, and then each rank reads
// its own part of each tensor from the files (checkpoint/part_read.h: FSDP's rows alone, anything
// else whole, cut to a split), so no rank holds more than its own files while it checks them and
// what it keeps. See Note [Reading a directory on every rank] in the .cpp.
#pragma once

#include <optional>
#include <string>

#include "checkpoint/state_view.h"
#include "cpprun/state_dict_options.h"

namespace cpprun::detail {

// Loads PATH (a directory, or the index it names) into the view's local tensors, then runs
// view.after_load; strict as load_state_dict, with its options and its report, the same on every
// rank. A damaged, missing or mismatched file is refused on every rank, naming it, with nothing
// changed: the reader raises its own error, the others the same one followed by "(raised on rank
// R)". Collective over the view's team (not alone). nullopt, having done nothing: PATH's directory
// holds a single file (model.safetensors, pytorch_model.bin), which the caller loads as a file.
std::optional<StateDictLoadReport> load_directory_in_parallel(const StateView& view, const std::string& path,
                                                              const StateDictOptions& options);

}  // namespace cpprun::detail
