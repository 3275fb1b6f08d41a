// See checkpoint.h.
#include "fsdp/checkpoint.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/serialize/archive.h>

#include <algorithm>
#include <functional>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "core/failure_agreement.h"
#include "checkpoint/optimizer_state.h"
#include "checkpoint/sharded_state_dict.h"
#include "cpprun/checkpoint_file.h"
#include "cpprun/collectives.h"
#include "cpprun/object_collectives.h"

namespace cpprun::detail {
namespace fs = std::filesystem;
namespace {

std::string rank_file(const std::string& dir, int rank) { return (fs::path(dir) / ("rank_" + std::to_string(rank) + ".pt")).string(); }
std::string meta_file(const std::string& dir) { return (fs::path(dir) / "meta.pt").string(); }
std::string key(const std::string& name, const std::string& what) { return name + "#" + what; }
constexpr int64_t kFormat = 2;  // 2: rows per parameter by name; 1 (no "format" key): flat shards

int64_t read_int(torch::serialize::InputArchive& archive, const std::string& name) {
  at::Tensor t;
  archive.read(name, t);
  return t.item<int64_t>();
}

constexpr const char* kArchiveSaveIdKey = "save_id";  // in every file of a save, meta.pt too

// The save id FILE records: "" when it has none (written before ids were).
std::string save_id_of(torch::serialize::InputArchive& archive) {
  c10::IValue id;
  return archive.try_read(kArchiveSaveIdKey, id) ? id.toStringRef() : std::string();
}

// One line per file whose save id differs from meta.pt's, naming it; META_ID "" for none.
std::string id_fault(const std::string& file, const std::string& id, const std::string& meta_id) {
  const auto quoted = [](const std::string& value) { return value.empty() ? std::string("none") : "\"" + value + "\""; };
  return file + ": save id " + quoted(id) + ", meta.pt's " + quoted(meta_id);
}

// This rank's rows of every parameter and their optimizer state, to PATH.
void write_shards(const std::vector<ParamBucket>& buckets, torch::optim::Optimizer* optimizer, const std::string& path,
                  const std::string& save_id) {
  torch::serialize::OutputArchive archive;
  archive.write(kArchiveSaveIdKey, c10::IValue(save_id));
  for (const ParamBucket& bucket : buckets) {
    for (const ShardedParam& s : bucket.params()) {
      archive.write(key(s.name, "shard"), s.shard.detach());
      if (!optimizer) continue;
      if (auto state = read_optimizer_state(*optimizer, s.shard)) {
        c10::List<std::string> names;
        for (const auto& [name, tensor] : state->tensors) {
          archive.write(key(s.name, "opt." + name), tensor);
          names.push_back(name);
        }
        archive.write(key(s.name, "opt.names"), names);
        archive.write(key(s.name, "opt.step"), at::tensor(state->step));
      }
    }
  }
  save_checkpoint(archive, path);
}

std::string shape_text(c10::IntArrayRef sizes) {
  std::ostringstream out;
  out << sizes;
  return out.str();
}

// Checks that the checkpoint in DIR holds exactly this model's parameters, with their shapes:
// one error listing every difference.
void check_meta(torch::serialize::InputArchive& meta, const std::vector<ParamBucket>& buckets, const std::string& dir) {
  c10::IValue format;
  TORCH_CHECK(meta.try_read("format", format), "cpprun: the sharded checkpoint in ", dir, " was written by an earlier "
              "cpprun, which saved flat shards per unit; this version saves and loads every parameter by name. Load it "
              "with that version and save a full state dict (save_full_state_dict), which loads here.");
  c10::IValue names_value, shapes_value;
  meta.read("names", names_value);
  meta.read("shapes", shapes_value);
  std::map<std::string, std::vector<int64_t>> saved;
  const auto names = names_value.toList();
  const auto shapes = shapes_value.toList();
  for (std::size_t i = 0; i < names.size(); ++i) saved[names.get(i).toStringRef()] = shapes.get(i).toIntVector();
  std::vector<std::string> problems;
  std::map<std::string, bool> seen;
  for (const ParamBucket& bucket : buckets) {
    for (const ShardedParam& s : bucket.params()) {
      auto it = saved.find(s.name);
      if (it == saved.end()) {
        problems.push_back("missing \"" + s.name + "\"");
      } else if (it->second != s.sizes) {
        problems.push_back("\"" + s.name + "\" has shape " + shape_text(it->second) + " there but " + shape_text(s.sizes) +
                           " here");
      }
      seen[s.name] = true;
    }
  }
  for (const auto& [name, sizes] : saved) {
    if (!seen.count(name)) problems.push_back("unexpected \"" + name + "\"");
  }
  if (problems.empty()) return;
  std::string list;
  for (const auto& p : problems) list += (list.empty() ? "" : "; ") + p;
  TORCH_CHECK(false, "cpprun: the sharded checkpoint in ", dir, " does not fit this model (", problems.size(),
              " difference(s)): ", list, ". It was saved from another model.");
}

}  // namespace

void save_sharded_checkpoint(const std::vector<ParamBucket>& buckets, const ShardGroups& groups,
                             torch::optim::Optimizer* optimizer, const std::string& dir) {
  const ProcessGroup& group = groups.whole;
  // One id in every file of the save, meta.pt's too: a load refuses files of different saves.
  std::string save_id = group.rank() == 0 ? new_save_id() : std::string();
  broadcast_bytes(group, save_id, 0);
  const std::string mine = rank_file(dir, groups.shard.rank());
  bool wrote = false;  // a failed write left the file of that name as it was
  const std::string what = "saving the sharded checkpoint in " + dir;
  // See Note [A failed save removes what it wrote] (checkpoint/sharded_state_dict.cpp): each rank its
  // own file, and meta.pt is not written.
  const auto agree_or_undo = [&](std::exception_ptr failure) {
    try {
      agree_on_failure(group, failure, what);
    } catch (...) {
      if (wrote) remove_written_file(dir, fs::path(mine).filename().string());
      throw;
    }
  };
  std::exception_ptr failure;
  try {
    fs::create_directories(dir);
    if (groups.first_replica()) {
      write_shards(buckets, optimizer, mine, save_id);
      wrote = true;
    }
  } catch (...) {
    failure = std::current_exception();
  }
  // Every rank's file is in place before meta.pt says the checkpoint is whole.
  agree_or_undo(failure);
  if (group.rank() == 0) {
    try {
      torch::serialize::OutputArchive meta;
      meta.write("format", at::tensor(kFormat));
      meta.write(kArchiveSaveIdKey, c10::IValue(save_id));
      meta.write("world_size", at::tensor(static_cast<int64_t>(groups.shard.size())));
      c10::List<std::string> names;
      c10::List<std::vector<int64_t>> shapes;
      for (const ParamBucket& bucket : buckets) {
        for (const ShardedParam& s : bucket.params()) {
          names.push_back(s.name);
          shapes.push_back(s.sizes);
        }
      }
      meta.write("names", names);
      meta.write("shapes", shapes);
      save_checkpoint(meta, meta_file(dir));
    } catch (...) {
      failure = std::current_exception();
    }
  }
  agree_or_undo(failure);
}

// Note [Resharding a checkpoint]
// Saved on W' ranks, a parameter of R rows was cut into rows [q*C', q*C' + C') per saved rank q
// (C' = ceil(R / W'); the last ones hold fewer, or none); now this rank owns rows
// [r*C, r*C + local). It reads only the saved ranks whose rows overlap that range and copies
// the overlaps, for the parameter and each optimizer state tensor alike.
void load_sharded_checkpoint(const std::vector<ParamBucket>& buckets, const ShardGroups& groups,
                             torch::optim::Optimizer* optimizer, const std::string& dir) {
  const ProcessGroup& group = groups.whole;
  // Each rank reads the files it needs: one may find a damaged file that the others never open.
  std::exception_ptr failure;
  torch::serialize::InputArchive meta;
  int64_t saved_world = 0;
  std::map<int64_t, torch::serialize::InputArchive> saved_ranks;  // opened on first need
  auto archive_of = [&](int64_t q) -> torch::serialize::InputArchive& {
    auto it = saved_ranks.find(q);
    if (it == saved_ranks.end()) {
      it = saved_ranks.emplace(q, torch::serialize::InputArchive()).first;
      load_checkpoint(it->second, rank_file(dir, static_cast<int>(q)));
    }
    return it->second;
  };
  // Calls fn(q, first, count, saved_first): saved rank q holds rows [first, first + count) of this
  // rank's, as its own rows [saved_first, saved_first + count).
  using Overlap = std::function<void(int64_t, int64_t, int64_t, int64_t)>;
  auto overlaps = [&](const ShardedParam& s, const Overlap& fn) {
    const int64_t saved_rows = (s.rows + saved_world - 1) / saved_world;
    const int64_t lo = s.first_row, hi = lo + s.local_rows;
    if (saved_rows == 0) return;
    for (int64_t q = lo / saved_rows; q < saved_world && q * saved_rows < hi; ++q) {
      const int64_t from = std::max(lo, q * saved_rows), to = std::min(hi, (q + 1) * saved_rows);
      if (from < to) fn(q, from - lo, to - from, from - q * saved_rows);
    }
  };
  std::string id_faults;  // this rank's files whose save id differs from meta.pt's, a line each
  try {
    TORCH_CHECK(fs::exists(meta_file(dir)), "cpprun: ", dir, " holds no complete sharded checkpoint (no meta.pt: ",
                "the save did not finish, or this is not a checkpoint directory).");
    load_checkpoint(meta, meta_file(dir));
    check_meta(meta, buckets, dir);
    saved_world = read_int(meta, "world_size");
    // Open (and check) every file this rank needs before changing a shard: a damaged file leaves
    // the model as it was.
    for (const ParamBucket& bucket : buckets) {
      for (const ShardedParam& s : bucket.params()) {
        overlaps(s, [&](int64_t q, int64_t, int64_t, int64_t) { archive_of(q); });
      }
    }
    // One save: every file's id is meta.pt's (none in files written before ids were). Each rank
    // checks the files it reads and every shard-size-th one besides, so that every file is
    // checked, those holding no rows this rank needs too.
    const std::string meta_id = save_id_of(meta);
    for (int64_t q = groups.shard.rank(); q < saved_world; q += groups.shard.size()) {
      if (saved_ranks.count(q)) continue;
      torch::serialize::InputArchive other;
      load_checkpoint(other, rank_file(dir, static_cast<int>(q)));
      const std::string id = save_id_of(other);
      if (id != meta_id) id_faults += id_fault("rank_" + std::to_string(q) + ".pt", id, meta_id) + "\n";
    }
    for (auto& [q, archive] : saved_ranks) {
      const std::string id = save_id_of(archive);
      if (id != meta_id) id_faults += id_fault("rank_" + std::to_string(q) + ".pt", id, meta_id) + "\n";
    }
  } catch (...) {
    failure = std::current_exception();
  }
  agree_on_failure(group, failure, "loading the sharded checkpoint in " + dir);
  // Every rank raises the same error, naming every file of another save that any rank found.
  std::set<std::string> mixed;
  for (const std::string& lines : all_gather_bytes(group, id_faults)) {
    for (std::size_t at = 0, end; at < lines.size(); at = end + 1) {
      end = lines.find('\n', at);
      mixed.insert(lines.substr(at, end - at));
    }
  }
  if (!mixed.empty()) {
    std::string list;
    for (const auto& line : mixed) list += "\n  " + line;
    throw CorruptCheckpointError("cpprun: the sharded checkpoint in " + dir + " mixes files of different saves (" +
                                 std::to_string(mixed.size()) + " file(s) differ from meta.pt), and nothing was "
                                 "loaded:" + list + "\nA save was interrupted, or files of different saves were put "
                                 "together: save again, or load an earlier checkpoint.");
  }
  try {
    at::NoGradGuard no_grad;
    for (const ParamBucket& bucket : buckets) {
      for (const ShardedParam& s : bucket.params()) {
        at::Tensor shard = s.shard.detach();
        std::optional<ParamOptimizerState> state;
        overlaps(s, [&](int64_t q, int64_t first, int64_t count, int64_t offset) {
          auto& archive = archive_of(q);
          at::Tensor saved;
          archive.read(key(s.name, "shard"), saved);
          shard.narrow(0, first, count).copy_(saved.narrow(0, offset, count));
          c10::IValue names;
          if (!optimizer || !archive.try_read(key(s.name, "opt.names"), names)) return;
          if (!state) {
            state.emplace();
            state->step = read_int(archive, key(s.name, "opt.step"));
          }
          for (const auto& name : names.toList()) {
            const std::string n = c10::IValue(name).toStringRef();
            at::Tensor piece;
            archive.read(key(s.name, "opt." + n), piece);
            auto& whole = state->tensors[n];
            if (!whole.defined()) whole = at::zeros_like(shard);
            whole.narrow(0, first, count).copy_(piece.narrow(0, offset, count));
          }
        });
        if (optimizer && state) write_optimizer_state(*optimizer, s.shard, *state);
      }
    }
  } catch (...) {
    failure = std::current_exception();
  }
  agree_on_failure(group, failure, "loading the sharded checkpoint in " + dir);
}

}  // namespace cpprun::detail
