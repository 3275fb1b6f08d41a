// A model's load from a sharded directory (Hugging Face's layout, checkpoint/sharded_state_dict.h)
// with the files read on every rank in parallel, as PyTorch's DCP reads: each writer of the
// view's team reads about 1/W of the files (checkpoint/reader_report.h), the team agrees that
// every file holds together and fits the model before any tensor changes, and then each tensor
// goes from its reader to the ranks that need it (a replicated one broadcast into place, FSDP's
// rows scattered: checkpoint/row_scatter.h; any other placement broadcast whole and cut), one
// tensor at a time, so no rank holds more than its own files' tensors and one tensor beyond its
// shards (their buffers allocated and agreed before the first moves: a rank out of memory fails
// the load on every rank). See Note [Reading a directory on every rank] in the .cpp.
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
