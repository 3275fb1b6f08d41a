// See parallel_load.h.
#include "checkpoint/parallel_load.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <cstdint>
#include <exception>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string_view>
#include <utility>
#include <vector>

#include "checkpoint/directory_read.h"
#include "checkpoint/part_read.h"
#include "checkpoint/sharded_state_dict.h"
#include "checkpoint/state_dict.h"
#include "cpprun/process_group.h"
#include "support/safetensors_index.h"

namespace cpprun::detail {

// Note [Reading a directory on every rank]
// The save writes file r + 1 on writer r, each tensor gathered only to its writer (Note [Gathering
// to the writer]); the load mirrors it. Writer w of the team reads the files i with i mod W = w,
// whatever world size saved them, and checks them (header, CRC, dtypes) as it reads them. What
// every check needs beyond one file (the index against the files, one save id, the strict
// comparison with the model, tied names holding one value) is decided from what each reader tells
// (checkpoint/reader_report.h: names, dtypes, shapes, save ids, a CRC of each tensor the model ties
// to another name): one all-gather of those few bytes, after which every rank decides alike, so a
// fault found anywhere is raised on every rank before any tensor of the model changes (a reader's
// own error, such as a damaged file, by that reader, and on the others with "(raised on rank R)").
// Then each rank reads its own part of each tensor straight from the files, at the offsets the
// readers reported (Note [Each rank reads its own part] in part_read.cpp): FSDP's rows (HSDP's
// too) as one byte range, a replicated tensor whole, a tensor-parallel split whole and cut
// (state_view.h's local_part). No tensor goes from rank to rank; a ZeRO-3 rank reads its files
// once to check them and 1/W of the model to keep. The path that a file, a team of one, or a
// directory holding model.safetensors takes is unchanged: the root reads, the values are
// broadcast.
namespace {

// Where PATH leads, as the team's root found it (it alone looks, so every rank takes the same way).
struct LoadTarget {
  bool single = false;  // a file in the directory, which the caller loads as a file
  std::string dir;
  std::string index_text;
};

LoadTarget resolve_load_target(const CheckpointTeam& team, const std::string& path) {
  std::string bytes;
  std::exception_ptr failure;
  if (team.is_root()) {
    try {
      std::string single;
      // Absolute, as the root names it: every rank then reads the same path whatever its working
      // directory (a rank on a node without it is refused, naming the files it lacks).
      const std::string dir = std::filesystem::absolute(sharded_load_directory(path, single)).lexically_normal().string();
      if (!single.empty()) {
        bytes = "S";
      } else {
        const std::string index_path = (std::filesystem::path(dir) / index_file_name(kModelStem)).string();
        std::string text = read_index_text(index_path);
        (void)read_safetensors_index(text, index_path);  // a malformed index: the root's error, on every rank
        bytes = "I" + dir + '\0' + text;
      }
    } catch (...) {
      failure = std::current_exception();
    }
  }
  team.share_root_failure(failure);
  team.broadcast_bytes(bytes);
  LoadTarget target;
  if (bytes == "S") {
    target.single = true;
    return target;
  }
  const std::size_t nul = bytes.find('\0');
  TORCH_INTERNAL_ASSERT(!bytes.empty() && bytes[0] == 'I' && nul != std::string::npos, "the load's target arrived garbled");
  target.dir = bytes.substr(1, nul - 1);
  target.index_text = bytes.substr(nul + 1);
  return target;
}

// The model's names that share their tensor with another name (tied weights).
std::set<std::string> tied_module_names(const StateView& view) {
  std::map<std::size_t, int> names_of_entry;
  for (const auto& [name, entry] : view.names) ++names_of_entry[entry];
  std::set<std::string> tied;
  for (const auto& [name, entry] : view.names) {
    if (names_of_entry[entry] > 1) tied.insert(name);
  }
  return tied;
}

// The strict comparison of the files' tensors (described, on the meta device) with the model's
// whole shapes and dtypes: StateDictMismatchError as a load of the tensors themselves throws.
StateDictLoadReport check_against_model(const StateView& view, const TeamDirectoryRead& read,
                                        const StateDictOptions& options) {
  std::vector<at::Tensor> described;
  for (const auto& entry : view.entries) {
    described.push_back(
        at::empty(entry.whole_sizes, at::TensorOptions().dtype(entry.local.scalar_type()).device(at::kMeta)));
  }
  NamedTensors mine;
  for (const auto& [name, entry] : view.names) mine.emplace_back(name, described[entry]);
  NamedTensors file;
  std::map<std::string, std::string> file_of;
  std::map<std::string, std::uint32_t> crc_of;  // the module's names
  for (const auto& [name, info] : read.info_of) {
    for (const auto& t : info->tensors) {
      file.emplace_back(t.name, at::empty(t.sizes, at::TensorOptions().dtype(t.dtype).device(at::kMeta)));
      file_of[t.name] = name;
      if (t.crc) crc_of[as_module_name(t.name, options)] = *t.crc;
    }
  }
  const SameTiedValues same = [&](const std::string& first_name, const at::Tensor&, const std::string& name,
                                  const at::Tensor&) {
    const auto a = crc_of.find(first_name), b = crc_of.find(name);
    TORCH_INTERNAL_ASSERT(a != crc_of.end() && b != crc_of.end(), "no CRC for the tied tensor ", first_name);
    return a->second == b->second;
  };
  return check_named_tensors(mine, file, read.dir, options, file_of, same);
}

// The tensor of the files that loads an entry: the last of its names the files hold with its
// whole shape and dtype (a tied tensor's names hold one value: checked), as copy_named_tensors.
struct FileTensor {
  std::string file;             // its file's path
  const FileIdentity* checked;  // that file as its reader checked it
  std::uint64_t offset = 0;     // where its bytes start in that file
};

}  // namespace

std::optional<StateDictLoadReport> load_directory_in_parallel(const StateView& view, const std::string& path,
                                                              const StateDictOptions& options) {
  at::NoGradGuard no_grad;
  const CheckpointTeam& team = view.team;
  TORCH_INTERNAL_ASSERT(!team.alone());
  const LoadTarget target = resolve_load_target(team, path);
  if (target.single) return std::nullopt;
  const std::set<std::string> tied = tied_module_names(view);
  TeamDirectoryRead read = read_directory_on_writers(team, target.dir, kModelStem, target.index_text,
                                                     [&](const std::string& name) {
                                                       return tied.count(as_module_name(name, options)) > 0;
                                                     });
  const StateDictLoadReport report = check_against_model(view, read, options);

  // Every check passed on every rank: each rank reads its own part of each tensor (Note [Each
  // rank reads its own part] in part_read.cpp).
  std::map<std::string, FileTensor> source_of;  // the module's names -> the file's tensor
  std::map<std::string, const ReadTensorInfo*> described;
  for (const auto& [file, info] : read.info_of) {
    for (const auto& t : info->tensors) {
      const std::string name = as_module_name(t.name, options);
      source_of[name] = {(std::filesystem::path(read.dir) / file).string(), &info->identity, t.offset};
      described[name] = &t;
    }
  }
  std::vector<std::vector<std::string>> names_of(view.entries.size());
  for (const auto& [name, entry] : view.names) names_of[entry].push_back(name);
  std::vector<std::pair<const StateEntry*, const FileTensor*>> reads;
  StagingBuffers staging;
  for (std::size_t e = 0; e < view.entries.size(); ++e) {
    const StateEntry& entry = view.entries[e];
    const FileTensor* source = nullptr;
    for (const auto& name : names_of[e]) {
      const auto found = source_of.find(name);
      if (found == source_of.end()) continue;
      const ReadTensorInfo& t = *described.at(name);
      if (t.sizes == entry.whole_sizes && t.dtype == entry.local.scalar_type()) source = &found->second;
    }
    if (!source) continue;  // strict(false): left as it is, and reported
    reads.emplace_back(&entry, source);
    if (!reads_into_local(entry)) staging.need(entry.local.scalar_type(), own_part(entry, 0, entry.local.scalar_type()).numel);
  }
  // The buffers, and the files still those the readers checked, on every rank before any tensor
  // changes (Note [Each rank reads its own part] in part_read.cpp).
  std::exception_ptr failure;
  try {
    staging.allocate();
    std::set<std::string> files;
    for (const auto& [entry, source] : reads) {
      if (files.insert(source->file).second) check_unchanged(source->file, *source->checked);
    }
  } catch (...) {
    failure = std::current_exception();
  }
  team.agree(failure, "loading " + target.dir + " (allocating the buffers its tensors are read through, "
                      "and finding its files as they were checked)");
  try {
    for (const auto& [entry, source] : reads) {
      const at::ScalarType dtype = entry->local.scalar_type();
      const FilePart part = own_part(*entry, source->offset, dtype);
      const at::Tensor local = entry->local.detach();
      if (reads_into_local(*entry)) {
        read_part(source->file, *source->checked, part, local);
        continue;
      }
      const at::Tensor staged = staging.view(dtype, part.numel);
      read_part(source->file, *source->checked, part, staged);
      if (entry->placement.tensor_parallel) {
        local.copy_(local_part(*entry, staged.view(entry->whole_sizes)));
      } else {
        local.copy_(staged.view(local.sizes()));
      }
    }
  } catch (...) {
    failure = std::current_exception();
  }
  team.agree(failure, "loading " + target.dir + " (reading each rank's part of its tensors)");
  if (view.after_load) view.after_load();
  return report;
}

}  // namespace cpprun::detail
