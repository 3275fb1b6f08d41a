// See sharded_checkpoint.h.
#include "checkpoint/sharded_checkpoint.h"
#include "comm/public_call.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/serialize/archive.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <vector>

#include "checkpoint/optimizer_state.h"
#include "checkpoint/sharded_state_dict.h"
#include "cpprun/checkpoint_file.h"
#include "cpprun/collectives.h"
#include "cpprun/detail/replaced_files.h"
#include "cpprun/model_checkpoint.h"
#include "cpprun/object_collectives.h"
#include "cpprun/state_dict_options.h"

namespace cpprun::detail {
namespace fs = std::filesystem;
namespace {

std::string rank_file(const std::string& dir, int64_t q) {
  return (fs::path(dir) / ("rank_" + std::to_string(q) + ".pt")).string();
}
std::string meta_file(const std::string& dir) { return (fs::path(dir) / "meta.pt").string(); }
std::string key(const std::string& name, const std::string& what) { return name + "#" + what; }
constexpr int64_t kFormat = 2;  // 2: rows per parameter by name; 1 (no "format" key): flat shards per unit
constexpr const char* kArchiveSaveIdKey = "save_id";  // in every file of a save, meta.pt too
// The optimizer's state tensors a file may hold (checkpoint/optimizer_state.h's names).
constexpr const char* kShardedStateNames[] = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer"};

int64_t read_int(torch::serialize::InputArchive& archive, const std::string& name) {
  at::Tensor t;
  archive.read(name, t);
  return t.item<int64_t>();
}

// The save id an archive records: "" when it has none (written before ids were).
std::string save_id_of(torch::serialize::InputArchive& archive) {
  c10::IValue id;
  return archive.try_read(kArchiveSaveIdKey, id) ? id.toStringRef() : std::string();
}

// One line per file whose save id differs from meta.pt's, naming it; META_ID "" for none.
std::string id_fault(int64_t q, const std::string& id, const std::string& meta_id) {
  const auto quoted = [](const std::string& value) { return value.empty() ? std::string("none") : "\"" + value + "\""; };
  return "rank_" + std::to_string(q) + ".pt: save id " + quoted(id) + ", meta.pt's " + quoted(meta_id);
}

std::string shape_text(c10::IntArrayRef sizes) {
  std::ostringstream out;
  out << sizes;
  return out.str();
}

// A tensor's rows are its dim 0; a 0-d tensor is one row (as FSDP shards it).
int64_t leading_rows(const std::vector<int64_t>& sizes) { return sizes.empty() ? 1 : sizes[0]; }
at::Tensor as_rows(const at::Tensor& t) { return t.dim() == 0 ? t.reshape({1}) : t; }

// The tensors the format holds: the trained parameters, not buffers nor frozen parameters, which
// FSDP's own format never held (FSDP shards frozen ones too: their shards do not require grad).
std::vector<const StateEntry*> saved_entries(const StateView& view) {
  std::vector<const StateEntry*> out;
  for (const StateEntry& entry : view.entries) {
    if (entry.parameter && (entry.local.requires_grad() || entry.module_tensor.requires_grad())) out.push_back(&entry);
  }
  return out;
}

// The files of a save (W) and the one whose rows this rank holds (q): FSDP's shard group's size
// and rank; one file when the model holds its parameters whole (DDP, a plain module; a
// tensor-parallel split is gathered whole first).
struct RowFiles {
  int64_t count = 1;
  int64_t mine = 0;
};
RowFiles row_files(const std::vector<const StateEntry*>& saved) {
  std::optional<RowFiles> out;
  for (const StateEntry* entry : saved) {
    if (!entry->placement.rows) continue;
    const RowFiles here{entry->placement.rows->group.size(), entry->placement.rows->group.rank()};
    if (!out) out = here;
    TORCH_INTERNAL_ASSERT(out->count == here.count && out->mine == here.mine,
                          "parameters row-sharded over different groups: ", entry->name);
  }
  return out.value_or(RowFiles{});
}

// Rows [first, first + count) of a tensor of `rows` rows: those file q of W holds.
struct RowRange {
  int64_t first = 0;
  int64_t count = 0;
};
RowRange rows_in_file(int64_t rows, int64_t files, int64_t q) {
  const int64_t per_file = (rows + files - 1) / files;
  const int64_t first = std::min(q * per_file, rows);
  return {first, std::min(rows - first, per_file)};
}

// FSDP's shard (no tensor-parallel split): its rows, min(q*C, rows) onwards, are those of file q
// as they are (fsdp/param_bucket.h cuts them so), written and read with no gather.
bool local_is_file_rows(const StateEntry& entry) {
  return entry.placement.rows.has_value() && !entry.placement.tensor_parallel.has_value();
}

// The maximum of `t` over every rank of the team: over the data-parallel group, then each
// tensor-parallel group (Note [Teams over a {dp, tp} mesh] in checkpoint_team.cpp).
void max_over_team(const CheckpointTeam& team, at::Tensor& t) {
  if (team.replicas()) all_reduce(*team.replicas(), t, ReduceOp::kMax);
  for (const auto& group : team.tensor_parallel()) all_reduce(group, t, ReduceOp::kMax);
}

// Every rank's lines (each ending in '\n') on every rank of the team, each once.
std::set<std::string> lines_over_team(const CheckpointTeam& team, const std::string& mine) {
  std::set<std::string> lines;
  const auto add = [&](const std::string& text) {
    for (std::size_t at = 0, end; at < text.size(); at = end + 1) {
      end = text.find('\n', at);
      if (end == std::string::npos) end = text.size();
      if (end > at) lines.insert(text.substr(at, end - at));
    }
  };
  add(mine);
  const auto share = [&](const ProcessGroup& group) {
    std::string joined;
    for (const auto& line : lines) joined += line + "\n";
    for (const std::string& text : all_gather_bytes(group, joined)) add(text);
  };
  if (team.replicas()) share(*team.replicas());
  for (const auto& group : team.tensor_parallel()) share(group);
  return lines;
}

// Whether this rank writes file `mine`: the first of the team's writers holding its rows (under
// HSDP every replica holds them: the first replica writes). Collective over the team's replicas.
bool writes_file(const CheckpointTeam& team, int64_t mine) {
  if (!team.replicas()) return team.writes();
  const std::string me = std::to_string(mine);
  const auto held = all_gather_bytes(*team.replicas(), team.writes() ? me : std::string("-"));
  if (!team.writes()) return false;
  for (int r = 0; r < team.replicas()->rank(); ++r) {
    if (held[static_cast<std::size_t>(r)] == me) return false;
  }
  return true;
}

// What this rank's file holds of one parameter: its rows and their optimizer state.
struct FileRows {
  at::Tensor rows;
  std::optional<ParamOptimizerState> state;
};

// Each saved parameter's rows in file `files.mine`: FSDP's shard as it is; a tensor held whole
// cut; a tensor-parallel split gathered whole (with its optimizer state), then cut. Collective
// over the team when any parameter is split (every rank joins each gather, writer or not).
std::vector<FileRows> rows_to_write(const std::vector<const StateEntry*>& saved, const RowFiles& files,
                                    const CheckpointTeam& team, torch::optim::Optimizer* optimizer) {
  const std::size_t n = saved.size();
  std::vector<std::optional<ParamOptimizerState>> local(n);
  if (optimizer) {
    for (std::size_t i = 0; i < n; ++i) local[i] = read_optimizer_state(*optimizer, saved[i]->local);
  }
  // Which split parameters have state, its step and its tensors: a rank holding no rows of one
  // may hold none where the others do, so the team agrees (max) and every rank joins the same
  // gathers (zeros where it holds nothing).
  constexpr std::size_t kNames = std::size(kShardedStateNames);
  std::vector<int64_t> agreed(n * (2 + kNames), 0);
  const bool any_split = std::any_of(saved.begin(), saved.end(),
                                     [](const StateEntry* e) { return e->placement.tensor_parallel.has_value(); });
  if (optimizer && any_split) {
    for (std::size_t i = 0; i < n; ++i) {
      if (!saved[i]->placement.tensor_parallel || !local[i]) continue;
      int64_t* flags = &agreed[i * (2 + kNames)];
      flags[0] = 1;
      flags[1] = local[i]->step;
      for (std::size_t k = 0; k < kNames; ++k) flags[2 + k] = local[i]->tensors.count(kShardedStateNames[k]) ? 1 : 0;
    }
    at::Tensor t = at::tensor(agreed, at::kLong).to(saved.front()->device);
    max_over_team(team, t);
    t = t.cpu();
    for (std::size_t j = 0; j < agreed.size(); ++j) agreed[j] = t[static_cast<int64_t>(j)].item<int64_t>();
  }
  std::vector<FileRows> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    const StateEntry& entry = *saved[i];
    if (local_is_file_rows(entry)) {
      out[i] = {entry.local.detach(), local[i]};
      continue;
    }
    const int64_t rows = leading_rows(entry.whole_sizes);
    const RowRange range = rows_in_file(rows, files.count, files.mine);
    // Compact: a narrowed view would carry the rest of the tensor into the file.
    const auto cut = [&](const at::Tensor& whole) {
      const at::Tensor all = as_rows(whole);
      return range.count == rows ? all : all.narrow(0, range.first, range.count).clone();
    };
    if (!entry.placement.tensor_parallel) {  // held whole
      out[i].rows = cut(entry.local.detach());
      if (local[i]) {
        out[i].state = ParamOptimizerState{local[i]->step, {}};
        for (const auto& [name, tensor] : local[i]->tensors) out[i].state->tensors[name] = cut(tensor.detach());
      }
      continue;
    }
    out[i].rows = cut(gather_whole(entry, entry.local));
    const int64_t* flags = &agreed[i * (2 + kNames)];
    if (flags[0] == 0) continue;
    out[i].state = ParamOptimizerState{flags[1], {}};
    for (std::size_t k = 0; k < kNames; ++k) {
      if (flags[2 + k] == 0) continue;
      at::Tensor mine;
      if (local[i] && local[i]->tensors.count(kShardedStateNames[k]))
        mine = local[i]->tensors.at(kShardedStateNames[k]).detach();
      if (!mine.defined()) mine = at::zeros_like(entry.local);
      out[i].state->tensors[kShardedStateNames[k]] = cut(gather_whole(entry, mine));
    }
  }
  return out;
}

void write_file(const std::vector<const StateEntry*>& saved, const std::vector<FileRows>& rows,
                const std::string& path, const std::string& save_id) {
  torch::serialize::OutputArchive archive;
  archive.write(kArchiveSaveIdKey, c10::IValue(save_id));
  for (std::size_t i = 0; i < saved.size(); ++i) {
    const std::string& name = saved[i]->name;
    archive.write(key(name, "shard"), rows[i].rows);
    if (!rows[i].state) continue;
    c10::List<std::string> names;
    for (const auto& [what, tensor] : rows[i].state->tensors) {
      archive.write(key(name, "opt." + what), tensor);
      names.push_back(what);
    }
    archive.write(key(name, "opt.names"), names);
    archive.write(key(name, "opt.step"), at::tensor(rows[i].state->step));
  }
  note_replacing(path);  // Note [A failed save puts the previous files back]
  save_checkpoint(archive, path);
  note_replaced(path);
}

// Checks that the checkpoint in DIR holds exactly this model's trained parameters, with their
// whole shapes: one error listing every difference.
void check_meta(torch::serialize::InputArchive& meta, const std::vector<const StateEntry*>& saved,
                const std::string& dir) {
  c10::IValue format;
  TORCH_CHECK(meta.try_read("format", format), "cpprun: the sharded checkpoint in ", dir, " was written by an earlier "
              "cpprun, which saved flat shards per unit; this version saves and loads every parameter by name. Load it "
              "with that version and save a full state dict (save_full_state_dict), which loads here.");
  c10::IValue names_value, shapes_value;
  meta.read("names", names_value);
  meta.read("shapes", shapes_value);
  std::map<std::string, std::vector<int64_t>> in_file;
  const auto names = names_value.toList();
  const auto shapes = shapes_value.toList();
  for (std::size_t i = 0; i < names.size(); ++i) in_file[names.get(i).toStringRef()] = shapes.get(i).toIntVector();
  std::vector<std::string> problems;
  std::set<std::string> seen;
  for (const StateEntry* entry : saved) {
    const auto found = in_file.find(entry->name);
    if (found == in_file.end()) {
      problems.push_back("missing \"" + entry->name + "\"");
    } else if (found->second != entry->whole_sizes) {
      problems.push_back("\"" + entry->name + "\" has shape " + shape_text(found->second) + " there but " +
                         shape_text(entry->whole_sizes) + " here");
    }
    seen.insert(entry->name);
  }
  for (const auto& [name, sizes] : in_file) {
    if (!seen.count(name)) problems.push_back("unexpected \"" + name + "\"");
  }
  if (problems.empty()) return;
  std::string list;
  for (const auto& p : problems) list += (list.empty() ? "" : "; ") + p;
  TORCH_CHECK(false, "cpprun: the sharded checkpoint in ", dir, " does not fit this model (", problems.size(),
              " difference(s)): ", list, ". It was saved from another model.");
}

}  // namespace

void save_sharded_checkpoint(const StateView& view, torch::optim::Optimizer* optimizer, const std::string& dir) {
  at::NoGradGuard no_grad;
  const CheckpointTeam& team = view.team;
  const std::vector<const StateEntry*> saved = saved_entries(view);
  const RowFiles files = row_files(saved);
  // One id in every file of the save, meta.pt's too: a load refuses files of different saves.
  std::string save_id = team.is_root() ? new_save_id() : std::string();
  team.broadcast_bytes(save_id);
  const bool writer = writes_file(team, files.mine);
  const std::vector<FileRows> rows = rows_to_write(saved, files, team, optimizer);
  const std::string mine = rank_file(dir, files.mine);
  const std::string what = "saving the sharded checkpoint in " + dir;
  // See Note [A failed save removes what it wrote] (checkpoint/sharded_state_dict.cpp): each rank its
  // own file, and meta.pt is not written; what they replaced comes back (Note [A failed save puts
  // the previous files back]).
  ReplacedFiles replaced;
  const auto agree_or_undo = [&](std::exception_ptr failure) {
    try {
      team.agree(failure, what);
    } catch (...) {
      replaced.put_back();
      throw;
    }
  };
  std::exception_ptr failure;
  try {
    create_checkpoint_directory(dir);
    if (writer) {
      write_file(saved, rows, mine, save_id);
    }
  } catch (...) {
    failure = std::current_exception();
  }
  // Every rank's file is in place before meta.pt says the checkpoint is whole.
  agree_or_undo(failure);
  if (team.is_root()) {
    try {
      torch::serialize::OutputArchive meta;
      meta.write("format", at::tensor(kFormat));
      meta.write(kArchiveSaveIdKey, c10::IValue(save_id));
      meta.write("world_size", at::tensor(files.count));
      c10::List<std::string> names;
      c10::List<std::vector<int64_t>> shapes;
      for (const StateEntry* entry : saved) {
        names.push_back(entry->name);
        shapes.push_back(entry->whole_sizes);
      }
      meta.write("names", names);
      meta.write("shapes", shapes);
      note_replacing(meta_file(dir));
      save_checkpoint(meta, meta_file(dir));
      note_replaced(meta_file(dir));
    } catch (...) {
      failure = std::current_exception();
    }
  }
  agree_or_undo(failure);
  replaced.done();
}

// Note [Resharding a checkpoint]
// Saved as W' files, a parameter of R rows was cut into rows [q*C', q*C' + C') per file q
// (C' = ceil(R / W'); the last ones hold fewer, or none); now this rank wants rows [lo, hi): its
// FSDP shard's, or all of them for a tensor it holds whole or splits by tensor parallelism (cut
// from the whole after). It reads only the files whose rows overlap that range and copies the
// overlaps, for the parameter and each optimizer state tensor alike.
void load_sharded_checkpoint(const StateView& view, torch::optim::Optimizer* optimizer, const std::string& dir) {
  at::NoGradGuard no_grad;
  const CheckpointTeam& team = view.team;
  const std::vector<const StateEntry*> saved = saved_entries(view);
  // Each rank reads the files it needs: one may find a damaged file that the others never open.
  std::exception_ptr failure;
  torch::serialize::InputArchive meta;
  int64_t saved_files = 0;
  std::map<int64_t, torch::serialize::InputArchive> archives;  // opened on first need
  auto archive_of = [&](int64_t q) -> torch::serialize::InputArchive& {
    auto it = archives.find(q);
    if (it == archives.end()) {
      it = archives.emplace(q, torch::serialize::InputArchive()).first;
      load_checkpoint(it->second, rank_file(dir, q));
    }
    return it->second;
  };
  // Calls fn(q, first, count, in_file): file q holds rows [first, first + count) of those this
  // rank wants (counted from the first it wants), as its own rows [in_file, in_file + count).
  using Overlap = std::function<void(int64_t, int64_t, int64_t, int64_t)>;
  auto overlaps = [&](const StateEntry& entry, const Overlap& fn) {
    const int64_t rows = leading_rows(entry.whole_sizes);
    const int64_t per_file = (rows + saved_files - 1) / saved_files;
    const bool own_rows = local_is_file_rows(entry);
    const int64_t lo = own_rows ? entry.placement.rows->first_row : 0;
    const int64_t hi = own_rows ? lo + entry.placement.rows->local_rows : rows;
    if (per_file == 0) return;
    for (int64_t q = lo / per_file; q < saved_files && q * per_file < hi; ++q) {
      const int64_t from = std::max(lo, q * per_file), to = std::min(hi, (q + 1) * per_file);
      if (from < to) fn(q, from - lo, to - from, from - q * per_file);
    }
  };
  std::string id_faults;  // this rank's files whose save id differs from meta.pt's, a line each
  try {
    TORCH_CHECK(fs::exists(meta_file(dir)), "cpprun: ", dir, " holds no complete sharded checkpoint (no meta.pt: ",
                "the save did not finish, or this is not a checkpoint directory).");
    load_checkpoint(meta, meta_file(dir));
    check_meta(meta, saved, dir);
    saved_files = read_int(meta, "world_size");
    TORCH_CHECK(saved_files >= 1, "cpprun: ", meta_file(dir), " says its save had world_size ", saved_files,
                "; a sharded checkpoint has one rank file or more. The file is not one cpprun wrote: save the "
                "checkpoint again.");
    // Open (and check) every file this rank needs before changing a tensor: a damaged file leaves
    // the model as it was.
    for (const StateEntry* entry : saved) overlaps(*entry, [&](int64_t q, int64_t, int64_t, int64_t) { archive_of(q); });
    // One save: every file's id is meta.pt's (none in files written before ids were). Each rank
    // checks the files it reads and every N-th one besides (N the team's data-parallel size), so
    // that every file is checked, those holding no rows this rank needs too.
    const std::string meta_id = save_id_of(meta);
    const int64_t first = team.replicas() ? team.replicas()->rank() : 0;
    const int64_t step = team.replicas() ? team.replicas()->size() : 1;
    for (int64_t q = first; q < saved_files; q += step) {
      if (archives.count(q)) continue;
      torch::serialize::InputArchive other;
      load_checkpoint(other, rank_file(dir, q));
      const std::string id = save_id_of(other);
      if (id != meta_id) id_faults += id_fault(q, id, meta_id) + "\n";
    }
    for (auto& [q, archive] : archives) {
      const std::string id = save_id_of(archive);
      if (id != meta_id) id_faults += id_fault(q, id, meta_id) + "\n";
    }
    // Every piece this rank copies from has the rows it is taken for and the tensor's other
    // dimensions (meta.pt vouches only for the whole shapes): checked before any copy,
    // so that a file that does not fit leaves the model and optimizer as they were.
    for (const StateEntry* entry : saved) {
      overlaps(*entry, [&](int64_t q, int64_t, int64_t count, int64_t in_file) {
        auto& archive = archive_of(q);
        const auto check = [&](const std::string& name, const at::Tensor& piece) {
          const at::Tensor piece_rows = as_rows(piece);
          const std::vector<int64_t> whole = entry->whole_sizes;
          const bool fits = piece_rows.dim() == std::max<int64_t>(1, static_cast<int64_t>(whole.size())) &&
                            piece_rows.size(0) >= in_file + count &&
                            std::equal(whole.begin() + (whole.empty() ? 0 : 1), whole.end(),
                                       piece_rows.sizes().begin() + 1);
          TORCH_CHECK(fits, "cpprun: ", rank_file(dir, q), " holds \"", name, "\" of shape ", shape_text(piece.sizes()),
                      ", which cannot give rows ", in_file, " to ", in_file + count, " of the ",
                      shape_text(entry->whole_sizes), " meta.pt describes: the file is not one cpprun wrote with "
                      "meta.pt; save the checkpoint again.");
        };
        at::Tensor piece;
        archive.read(key(entry->name, "shard"), piece);
        check(key(entry->name, "shard"), piece);
        c10::IValue names;
        if (!optimizer || !archive.try_read(key(entry->name, "opt.names"), names)) return;
        for (const auto& name : names.toList()) {
          const std::string state_key = key(entry->name, "opt." + c10::IValue(name).toStringRef());
          at::Tensor saved_piece;
          archive.read(state_key, saved_piece);
          check(state_key, saved_piece);
        }
      });
    }
  } catch (...) {
    failure = std::current_exception();
  }
  const std::string what = "loading the sharded checkpoint in " + dir;
  team.agree(failure, what);
  // Every rank raises the same error, naming every file of another save that any rank found.
  const std::set<std::string> mixed = lines_over_team(team, id_faults);
  if (!mixed.empty()) {
    std::string list;
    for (const auto& line : mixed) list += "\n  " + line;
    throw CorruptCheckpointError("cpprun: the sharded checkpoint in " + dir + " mixes files of different saves (" +
                                 std::to_string(mixed.size()) + " file(s) differ from meta.pt), and nothing was "
                                 "loaded:" + list + "\nA save was interrupted, or files of different saves were put "
                                 "together: save again, or load an earlier checkpoint." +
                                 interrupted_save_note(dir));
  }
  try {
    for (const StateEntry* entry : saved) {
      const at::Tensor local = entry->local.detach();
      // Where the rows go: the local tensor itself, or for a tensor-parallel split the whole
      // tensor (zeros: the files cover every row, and an uncovered one would not pass unseen as
      // stale memory), of which this rank keeps its part.
      const bool split = entry->placement.tensor_parallel.has_value();
      const at::Tensor target = split ? at::zeros(entry->whole_sizes, local.options()) : local;
      const at::Tensor rows = as_rows(target);
      std::optional<ParamOptimizerState> state;
      overlaps(*entry, [&](int64_t q, int64_t first, int64_t count, int64_t in_file) {
        auto& archive = archive_of(q);
        at::Tensor piece;
        archive.read(key(entry->name, "shard"), piece);
        rows.narrow(0, first, count).copy_(as_rows(piece).narrow(0, in_file, count));
        c10::IValue names;
        if (!optimizer || !archive.try_read(key(entry->name, "opt.names"), names)) return;
        if (!state) {
          state.emplace();
          state->step = read_int(archive, key(entry->name, "opt.step"));
        }
        for (const auto& name : names.toList()) {
          const std::string state_name = c10::IValue(name).toStringRef();
          at::Tensor saved_piece;
          archive.read(key(entry->name, "opt." + state_name), saved_piece);
          auto& all = state->tensors[state_name];
          if (!all.defined()) all = at::zeros_like(rows);
          all.narrow(0, first, count).copy_(as_rows(saved_piece).narrow(0, in_file, count));
        }
      });
      if (split) local.copy_(local_part(*entry, target));
      if (!optimizer || !state) continue;
      for (auto& [state_name, tensor] : state->tensors) {
        tensor = split ? local_part(*entry, tensor.view(entry->whole_sizes)).clone(at::MemoryFormat::Contiguous)
                       : tensor.view(local.sizes());
      }
      write_optimizer_state(*optimizer, entry->local, *state);
    }
  } catch (...) {
    failure = std::current_exception();
  }
  team.agree(failure, what);
  if (view.after_load) view.after_load();
}

void save_rank_files(StateSource source, torch::optim::Optimizer& optimizer, const std::string& dir) {
  PublicCallScope call("cpprun::save_sharded_checkpoint");
  save_sharded_checkpoint(state_view(source), &optimizer, dir);
}

void load_rank_files(StateSource source, torch::optim::Optimizer& optimizer, const std::string& dir) {
  PublicCallScope call("cpprun::load_sharded_checkpoint");
  load_sharded_checkpoint(state_view(source), &optimizer, dir);
}

}  // namespace cpprun::detail
