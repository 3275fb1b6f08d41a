// See sharded_state_dict.h.
#include "checkpoint/sharded_state_dict.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <random>
#include <set>
#include <system_error>

#include "core/failure_agreement.h"
#include "checkpoint/rows_in_place.h"
#include "checkpoint/save_ids.h"
#include "checkpoint/state_dict.h"
#include "cpprun/atomic_file.h"
#include "cpprun/checkpoint_file.h"
#include "cpprun/detail/replaced_files.h"
#include "cpprun/object_collectives.h"
#include "cpprun/process_group.h"
#include "support/file_read.h"
#include "support/safetensors.h"
#include "support/safetensors_index.h"

namespace cpprun::detail {
namespace fs = std::filesystem;
namespace {

const std::string kIndexName(kSafetensorsIndexName);
const std::string kSingleName(kSafetensorsSingleName);

bool names_index_file(const std::string& path) { return fs::path(path).filename().string() == kIndexName; }

// Each tensor's part (0-based) and how many parts there are, the same on every rank.
struct Plan {
  std::vector<int> part;
  int parts = 0;
};
Plan plan_for(const NamedTensors& state, int world) {
  std::vector<std::uint64_t> bytes;
  for (const auto& [name, tensor] : state) bytes.push_back(tensor.nbytes());
  Plan plan{partition_by_bytes(bytes, world), 0};
  for (const int p : plan.part) plan.parts = std::max(plan.parts, p + 1);
  return plan;
}

std::map<std::string, std::string> stamp_metadata(const ShardedSaveStamp& stamp) {
  std::map<std::string, std::string> metadata = stamp.metadata;
  metadata[std::string(kSaveIdKey)] = stamp.save_id;
  if (stamp.step) metadata[std::string(kStepKey)] = std::to_string(*stamp.step);
  return metadata;
}

// The first lines, one a line, then how many more: a crafted index naming a million files must not
// make an error message of hundreds of megabytes.
std::string join_lines(const std::vector<std::string>& lines) {
  constexpr std::size_t kShown = 50;
  std::string out;
  for (std::size_t i = 0; i < lines.size() && i < kShown; ++i) out += "\n  " + lines[i];
  if (lines.size() > kShown) out += "\n  ... and " + std::to_string(lines.size() - kShown) + " more";
  return out;
}

// PyTorch's torch.distributed.checkpoint (dcp.save) writes DIR/.metadata and DIR/__R_0.distcp
// (FileSystemWriter): a layout cpprun does not read, which scripts/dcp_convert.py converts.
void refuse_dcp_directory(const fs::path& dir) {
  std::error_code ignored;
  if (!fs::exists(dir / ".metadata", ignored)) return;
  bool has_distcp = false;
  for (fs::directory_iterator it(dir, ignored), end; !ignored && it != end && !has_distcp; it.increment(ignored)) {
    has_distcp = it->path().extension() == ".distcp";
  }
  if (!has_distcp) return;
  throw StateDictMismatchError("cpprun: load_state_dict: " + dir.string() + " is a PyTorch "
                               "torch.distributed.checkpoint (DCP) directory (.metadata and *.distcp files, as "
                               "dcp.save writes), which cpprun does not read. Convert it once: python "
                               "scripts/dcp_convert.py to-cpprun " + dir.string() + " OUT_DIR (the model, and the "
                               "optimizer when there is one), then load_state_dict(model, \"OUT_DIR/\") and "
                               "load_optimizer_state_dict(model, optimizer, \"OUT_DIR/\"); see docs/checkpoints.md.");
}

}  // namespace

// Note [A failed save removes what it wrote]
// A save that fails (a full disk, on any rank) must not leave its files behind, keeping the disk
// full and a directory that looks like a checkpoint: once the ranks agree that the save failed,
// each rank removes the file it wrote in this save (it knows its name: no listing, so never a
// file of an earlier save), and no index is written, so an earlier index is left as it was. The
// directory itself stays (another save may share it). A file this save replaced gets its previous
// version back (Note [A failed save puts the previous files back], checkpoint/replaced_files.cpp),
// and so do the model's files when its optimizer's save, in the same scope, fails.

void create_checkpoint_directory(const std::string& dir) {
  std::error_code error;
  fs::create_directories(dir, error);
  if (error) {
    throw std::system_error(error, "cpprun: cannot create the checkpoint directory " + dir +
                                       " (a parent that is a file, a read-only file system, no permission?)");
  }
}

bool is_sharded_state_dict_path(const std::string& path) {
  if (path.empty()) return false;
  if (path.back() == '/') return true;
  if (names_index_file(path)) return true;
  std::error_code ignored;
  return fs::is_directory(path, ignored);
}

std::string sharded_directory_of(const std::string& path, std::string_view stem) {
  const fs::path given(path);
  return (given.filename() == index_file_name(stem) ? given.parent_path() : given).string();
}

std::string new_save_id() {
  std::random_device device;
  std::string id;
  for (int i = 0; i < 4; ++i) {
    char text[9];
    std::snprintf(text, sizeof text, "%08x", static_cast<unsigned>(device()));
    id += text;
  }
  return id;
}

StateDictShard state_dict_shard(const NamedTensors& state, int rank, int world, std::string_view stem) {
  const Plan plan = plan_for(state, world);
  StateDictShard shard;
  if (rank >= plan.parts) return shard;  // owns no tensor
  for (std::size_t i = 0; i < state.size(); ++i) {
    if (plan.part[i] == rank) shard.tensors.push_back(state[i]);
  }
  shard.file = shard_file_name(rank + 1, plan.parts, stem);
  return shard;
}

int shard_file_count(const NamedTensors& state, int world) { return plan_for(state, world).parts; }

StateDictShard state_dict_shard(const NamedTensors& state, int rank, int world, std::string_view stem,
                                int files_before, int files_in_all) {
  StateDictShard shard = state_dict_shard(state, rank, world, stem);
  if (!shard.file.empty()) shard.file = shard_file_name(files_before + rank + 1, files_in_all, stem);
  return shard;
}

void write_state_dict_shard(const StateDictShard& shard, const std::string& dir, const ShardedSaveStamp& stamp) {
  if (shard.file.empty()) return;
  const std::string path = (fs::path(dir) / shard.file).string();
  note_replacing(path);  // Note [A failed save puts the previous files back]
  write_safetensors_file(path, shard.tensors, stamp_metadata(stamp));
  note_replaced(path);
}

void write_state_dict_shard(const NamedTensors& state, const std::string& dir, int rank, int world,
                            const ShardedSaveStamp& stamp, std::string_view stem) {
  write_state_dict_shard(state_dict_shard(state, rank, world, stem), dir, stamp);
}

void check_sharded_save_path(const std::string& dir) {
  TORCH_CHECK(!names_index_file(dir), "cpprun: save_state_dict(model, \"", dir,
              "\"): to save in Hugging Face's sharded layout, name the directory (\"",
              fs::path(dir).parent_path().string(), "/\"); the index is written there.");
}

IndexPlan index_plan(const NamedTensors& state, int world, std::string_view stem) {
  const Plan plan = plan_for(state, world);
  IndexPlan out;
  for (std::size_t i = 0; i < state.size(); ++i) {
    out.weight_map[state[i].first] = shard_file_name(plan.part[i] + 1, plan.parts, stem);
    out.total_bytes += state[i].second.nbytes();
  }
  return out;
}

void write_state_dict_index(const NamedTensors& state, const std::string& dir, int world,
                            const ShardedSaveStamp& stamp, std::string_view stem) {
  IndexPlan plan = index_plan(state, world, stem);
  write_state_dict_index(std::move(plan.weight_map), plan.total_bytes, dir, stamp, stem);
}

void write_state_dict_index(std::map<std::string, std::string> weight_map, std::uint64_t total_bytes,
                            const std::string& dir, const ShardedSaveStamp& stamp, std::string_view stem) {
  SafetensorsIndex index;
  index.metadata = stamp_metadata(stamp);
  index.weight_map = std::move(weight_map);
  index.metadata["total_size"] = std::to_string(total_bytes);
  const std::string index_path = (fs::path(dir) / index_file_name(stem)).string();
  note_replacing(index_path);  // Note [A failed save puts the previous files back]
  write_file_atomically(index_path, write_safetensors_index(index));
  note_replaced(index_path);
  // What an earlier save left: other shard files, and a model.safetensors that transformers'
  // from_pretrained would load in preference to the index (as save_pretrained cleans up); only
  // STEM's files: a model's save leaves the optimizer's beside it, and the reverse.
  std::set<std::string> written;
  for (const auto& [name, file] : index.weight_map) written.insert(file);
  const std::string single = single_file_name(stem);
  // The index is written: the save is done, and a file that cannot be removed stays (it is
  // not named by the index) rather than failing the save.
  std::error_code ignored;
  for (fs::directory_iterator entry(dir, ignored), end; !ignored && entry != end; entry.increment(ignored)) {
    const std::string name = entry->path().filename().string();
    if ((is_shard_file_name(name, stem) && !written.count(name)) || name == single) {
      const std::string path = entry->path().string();
      note_replacing(path);  // removed as replaced: back if the save around this one fails
      std::error_code not_removed;
      if (fs::remove(path, not_removed)) note_replaced(path);
    }
  }
}

InPlaceStamp in_place_stamp(const CheckpointTeam& team, const ShardedSaveStamp& stamp, const std::string& what) {
  std::string shared;  // empty on every rank: the root could not draw its token
  std::exception_ptr no_token;
  if (team.is_root()) {
    try {
      std::vector<std::string> items{new_save_id().substr(0, 16)};  // the token, then each key and value
      for (const auto& [key, value] : stamp_metadata(stamp)) items.push_back(key), items.push_back(value);
      shared = pack_strings(items);
    } catch (...) {
      shared.clear(), no_token = std::current_exception();
    }
  }
  team.broadcast_bytes(shared);
  if (shared.empty()) {
    if (no_token) std::rethrow_exception(no_token);
    throw_failed_elsewhere("cpprun: " + what + " failed on the first rank (its own error says why); rank " +
                           std::to_string(cpprun::rank()) + " of the job stops too.");
  }
  const std::vector<std::string> items = unpack_strings(shared, "the save's metadata");
  TORCH_INTERNAL_ASSERT(items.size() % 2 == 1, "the save's metadata arrived garbled");
  InPlaceStamp out{items[0], {}};
  for (std::size_t i = 1; i + 1 < items.size(); i += 2) out.metadata[items[i]] = items[i + 1];
  return out;
}

void save_sharded_tensors(const NamedTensors& state, const CheckpointTeam& team, const std::string& dir,
                          const StateDictSaveOptions& options, std::string_view stem,
                          const std::map<std::string, std::string>& metadata, const RowsInPlace* in_place) {
  check_sharded_save_path(dir);
  const std::set<std::string> stems{std::string(stem)};
  const bool decides = team.is_root();  // See Note [One save id for a model and its optimizer]
  ShardedSaveStamp stamp{decides ? claim_save_id(dir, options, stems) : std::string(), options.step(), metadata};
  team.broadcast_bytes(stamp.save_id);  // the root's id in every file
  const StateDictShard shard =
      team.writes() ? state_dict_shard(state, team.writer_rank(), team.writers(), stem) : StateDictShard();
  // See Note [A failed save removes what it wrote] and Note [A failed save puts the previous files back].
  ReplacedFiles replaced;
  const auto undo = [&] {
    replaced.put_back();
    if (decides) forget_failed_save(dir, stamp.save_id, stems);
  };
  if (team.alone()) {
    try {
      create_checkpoint_directory(dir);
      write_state_dict_shard(shard, dir, stamp);
      write_state_dict_index(state, dir, 1, stamp, stem);
    } catch (...) {
      undo();
      throw;
    }
    replaced.done();
    return;
  }
  const std::string what = "saving the state dict to " + dir;
  std::exception_ptr failure;
  if (team.is_root()) {
    try {
      create_checkpoint_directory(dir);
    } catch (...) {
      failure = std::current_exception();
    }
  }
  team.agree(failure, what);
  const auto agree_or_undo = [&] {
    try {
      team.agree(failure, what);
    } catch (...) {
      undo();
      throw;
    }
  };
  if (in_place && in_place->used) {
    // See Note [Each rank writes its own rows]: its steps end agreed, every file in place.
    try {
      const InPlaceStamp shared = in_place_stamp(team, stamp, what);
      write_shards_in_place(state, *in_place, team, dir, stem, shared.metadata, shared.token, what);
    } catch (...) {
      undo();
      throw;
    }
  } else {
    if (team.writes()) {
      try {
        write_state_dict_shard(shard, dir, stamp);
      } catch (...) {
        failure = std::current_exception();
      }
    }
    // Every file is in place before the index names them.
    agree_or_undo();
  }
  if (team.is_root()) {
    try {
      write_state_dict_index(state, dir, team.writers(), stamp, stem);
    } catch (...) {
      failure = std::current_exception();
    }
  }
  agree_or_undo();
  replaced.done();
}

std::string read_index_text(const std::string& path) {
  try {
    return read_regular_file(path, "safetensors index", kMaxSafetensorsIndexBytes);
  } catch (const FileTooLargeError& e) {
    throw CorruptCheckpointError(e.what());  // what every other fault of an index is
  }
}

SafetensorsIndex read_index_file(const std::string& path) { return read_safetensors_index(read_index_text(path), path); }

ShardedDirectory read_sharded_directory(const std::string& dir_text, std::string_view stem,
                                        const std::set<std::string>* wanted) {
  const fs::path dir(dir_text);
  const fs::path index_path = dir / index_file_name(stem);
  ShardedDirectory out;
  out.index_path = index_path.string();
  out.index = read_index_file(index_path.string());
  const SafetensorsIndex& index = out.index;

  // Every file the index names must be there before any is read.
  const std::map<std::string, std::vector<std::string>> promised = files_of_index(index);
  std::vector<std::string> absent;
  for (const auto& [file, names] : promised) {
    if (!fs::exists(dir / file)) absent.push_back(file);
  }
  if (!absent.empty()) throw absent_files_error(out.index_path, dir_text, promised, absent);
  // Read (and check each file's CRC), one file's bytes at a time.
  std::vector<ShardFileContents> contents;
  for (const auto& [file, names] : promised) {
    const auto is_wanted = [&](const std::string& name) { return wanted->count(name) > 0; };
    if (wanted && std::none_of(names.begin(), names.end(), is_wanted)) {
      continue;  // another rank's part; its reader checks it
    }
    const std::string file_path = (dir / file).string();
    const std::string bytes = read_state_dict_bytes(file_path);
    const SafetensorsFile parsed = read_safetensors(bytes, file_path);
    if (contents.empty()) out.metadata = parsed.metadata;
    ShardFileContents seen{file, {}, {}};
    const auto id = parsed.metadata.find(std::string(kSaveIdKey));
    if (id != parsed.metadata.end()) seen.save_id = id->second;
    for (auto& [name, tensor] : decode_safetensors(parsed, file_path)) {
      seen.tensors.push_back(name);
      out.file_of[name] = file;
      out.tensors.emplace_back(name, std::move(tensor));
    }
    contents.push_back(std::move(seen));
  }
  if (contents.empty()) {
    // No file read: an index of no tensors (an optimizer saved before its first step holds no
    // state) or none of them wanted here. The index carries the same stamp as every file.
    out.metadata = index.metadata;
    out.metadata.erase("total_size");
  }
  const std::vector<std::string> faults = sharded_directory_faults(index, contents);
  if (!faults.empty()) throw directory_faults_error(dir_text, faults);
  return out;
}

std::map<std::string, std::vector<std::string>> files_of_index(const SafetensorsIndex& index) {
  std::map<std::string, std::vector<std::string>> promised;
  for (const auto& [name, file] : index.weight_map) promised[file].push_back(name);
  return promised;
}

CorruptCheckpointError absent_files_error(const std::string& index_path, const std::string& dir,
                                          const std::map<std::string, std::vector<std::string>>& promised,
                                          const std::vector<std::string>& absent) {
  std::vector<std::string> lines;
  for (const auto& file : absent) {
    const std::vector<std::string>& names = promised.at(file);
    lines.push_back(file + " (" + std::to_string(names.size()) + " tensor(s), e.g. \"" + names.front() + "\")");
  }
  return CorruptCheckpointError("cpprun: the sharded checkpoint " + index_path + " names " +
                                std::to_string(absent.size()) + " file(s) that " + dir + " lacks:" +
                                join_lines(lines) + "\nWas a shard lost or not copied? Nothing was loaded.");
}

CorruptCheckpointError directory_faults_error(const std::string& dir, const std::vector<std::string>& faults) {
  return CorruptCheckpointError("cpprun: the sharded checkpoint in " + dir + " does not hold together (" +
                                std::to_string(faults.size()) + " fault(s)), and nothing was loaded:" +
                                join_lines(faults) + "\nA save was interrupted, or files of different saves were "
                                "put together: save again, or load an earlier checkpoint." +
                                interrupted_save_note(dir));
}

std::string sharded_load_directory(const std::string& path, std::string& single) {
  single.clear();
  const bool names_index = names_index_file(path);
  const fs::path dir = names_index ? fs::path(path).parent_path() : fs::path(path);
  const fs::path index_path = dir / kIndexName;
  const fs::path single_path = dir / kSingleName;
  if (!names_index) {
    std::error_code ignored;
    if (!fs::exists(dir, ignored)) {
      throw std::system_error(std::make_error_code(std::errc::no_such_file_or_directory),
                              "cpprun: load_state_dict: " + path + " does not exist");
    }
    TORCH_CHECK(fs::is_directory(dir), "cpprun: load_state_dict: ", path, " is not a directory (a path ending in '/' "
                "names a directory in Hugging Face's sharded layout).");
    const bool has_index = fs::exists(index_path), has_single = fs::exists(single_path);
    TORCH_CHECK(!(has_index && has_single), "cpprun: load_state_dict: ", dir.string(), " holds both ",
                kSafetensorsIndexName, " and ", kSafetensorsSingleName, ", which may be two different saves "
                "(transformers would load ", kSafetensorsSingleName, "). Remove the one you do not mean, or name "
                "the file to load.");
    if (has_single) {
      single = single_path.string();
      return dir.string();
    }
    // transformers' names before safetensors (save_pretrained(safe_serialization=False)), which its
    // from_pretrained still reads when a directory has no safetensors: one torch.save file, read
    // here, or shards of them, not.
    const fs::path torch_save_path = dir / "pytorch_model.bin";
    if (!has_index && fs::exists(torch_save_path)) {
      single = torch_save_path.string();
      return dir.string();
    }
    TORCH_CHECK(has_index || !fs::exists(dir / "pytorch_model.bin.index.json"), "cpprun: load_state_dict: ",
                dir.string(), " holds pytorch_model.bin.index.json, transformers' sharded torch.save files, which "
                "cpprun does not read (it reads ", kSafetensorsIndexName, ", ", kSafetensorsSingleName,
                " and pytorch_model.bin). Convert them once in Python: AutoModel.from_pretrained(DIR)."
                "save_pretrained(OUT) writes safetensors.");
    refuse_dcp_directory(dir);
    TORCH_CHECK(has_index, "cpprun: load_state_dict: ", dir.string(), " holds neither ", kSafetensorsIndexName,
                " nor ", kSafetensorsSingleName, " nor pytorch_model.bin (Hugging Face's names for a model's "
                "weights): is it the checkpoint directory?");
  }
  return dir.string();
}

StateDictLoadReport load_sharded_state_dict(const NamedTensors& into, const std::string& path,
                                            const StateDictOptions& options) {
  std::string single;
  const fs::path dir = sharded_load_directory(path, single);
  if (!single.empty()) return load_state_dict_file(into, single, options);
  ShardedDirectory read = read_sharded_directory(dir.string(), kModelStem);
  return load_named_tensors(into, read.tensors, dir.string(), options, read.file_of);
}

}  // namespace cpprun::detail

namespace cpprun {
std::string new_save_id() { return detail::new_save_id(); }
}  // namespace cpprun
