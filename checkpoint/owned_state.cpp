// See owned_state.h.
#include "checkpoint/owned_state.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <map>
#include <numeric>
#include <set>
#include <sstream>
#include <string_view>
#include <unordered_set>

#include "checkpoint/async_save.h"
#include "checkpoint/save_ids.h"
#include "checkpoint/sharded_state_dict.h"
#include "checkpoint/state_dict.h"
#include "core/failure_agreement.h"
#include "cpprun/collectives.h"
#include "cpprun/detail/replaced_files.h"
#include "cpprun/object_collectives.h"
#include "cpprun/point_to_point.h"
#include "support/safetensors_index.h"

namespace cpprun::detail {
namespace {

namespace fs = std::filesystem;

constexpr int kTensorTag = 0;  // the save runs between steps: no stage message is in flight

// Note [Teams and owners]
// Rank (d, p, t) of a {dp, pp, tp} layout is in the owners group {(d, *, t)} and in its team
// (the data-parallel group {(*, p, t)} and the tensor-parallel group {(d, p, *)}). A step over the
// owners, then the team's two (Note [Teams over a {dp, tp} mesh]), reaches every rank; the team
// roots (0, *, 0) form one owners group, where whole tensors move between owners, and in every
// other owners group no rank is a root: a condition on team.is_root() is the same across an
// owners group, so collectives under it meet.

// Whether any rank of the job failed; rethrows this rank's own error, else one naming `what`.
void agree_everywhere(const CheckpointTeam& team, const ProcessGroup& owners, std::exception_ptr local,
                      const std::string& what) {
  at::Tensor failed = at::tensor({local ? 1 : 0}, at::kInt);
  all_reduce(owners, failed, ReduceOp::kMax);
  if (const ProcessGroup* replicas = team.replicas()) all_reduce(*replicas, failed, ReduceOp::kMax);
  for (const auto& group : team.tensor_parallel()) all_reduce(group, failed, ReduceOp::kMax);
  if (local) std::rethrow_exception(local);
  TORCH_CHECK(failed.item<int>() == 0, "cpprun: ", what, " failed on another rank (its own error says why); rank ",
              cpprun::rank(), " of the job stops too.");
}

// Refuses, on every rank, owners groups whose ranks are roots of their teams on some and not on
// others: the teams were built on groups laid out differently from stage to stage.
void check_roots_line_up(const CheckpointTeam& team, const ProcessGroup& owners, const std::string& what) {
  at::Tensor roots = at::tensor({team.is_root() ? 1 : 0}, at::kInt);
  all_reduce(owners, roots, ReduceOp::kSum);
  const int count = roots.item<int>();
  std::exception_ptr mismatch;
  try {
    TORCH_CHECK(count == 0 || count == owners.size(), "cpprun: ", what, ": in one pipeline group ", count, " of ",
                owners.size(), " ranks are the first of their stage's data- and tensor-parallel groups, the others "
                "not. A stage that holds no tensor-parallel module (a final norm and a head, say) is held whole by "
                "each rank of its tensor-parallel group: tell every stage that group, "
                "stage.set_tensor_parallel_group(mesh.group(\"tp\")). And build every stage's groups from one "
                "DeviceMesh (e.g. {pp, dp, tp}), so that a pipeline group's ranks sit at the same data- and "
                "tensor-parallel coordinates.");
  } catch (...) {
    mismatch = std::current_exception();
  }
  agree_everywhere(team, owners, mismatch, what);
}

// The tensors' names, dtypes, shapes and device types, for a receiver to allocate them:
// NAME \0 "dtype cuda ndim d0 d1 ..." \0 per tensor.
std::string describe_layout(const NamedTensors& tensors) {
  std::string out;
  for (const auto& [name, tensor] : tensors) {
    std::ostringstream line;
    line << static_cast<int>(tensor.scalar_type()) << ' ' << (tensor.is_cuda() ? 1 : 0) << ' ' << tensor.dim();
    for (const int64_t size : tensor.sizes()) line << ' ' << size;
    out += name + '\0' + line.str() + '\0';
  }
  return out;
}

NamedTensors allocate_layout(const std::string& layout, const NamedTensors& mine) {
  c10::Device cuda(c10::kCUDA);  // a CUDA tensor arrives on this rank's CUDA device, if it has one in use
  for (const auto& [name, tensor] : mine) {
    if (tensor.is_cuda()) cuda = tensor.device();
  }
  NamedTensors out;
  std::size_t at = 0;
  while (at < layout.size()) {
    const std::size_t name_end = layout.find('\0', at), line_end = layout.find('\0', name_end + 1);
    TORCH_INTERNAL_ASSERT(name_end != std::string::npos && line_end != std::string::npos, "a garbled tensor layout");
    std::istringstream line(layout.substr(name_end + 1, line_end - name_end - 1));
    int dtype = 0, is_cuda = 0, dims = 0;
    line >> dtype >> is_cuda >> dims;
    std::vector<int64_t> sizes(static_cast<std::size_t>(dims));
    for (auto& size : sizes) line >> size;
    const auto options = at::TensorOptions().dtype(static_cast<at::ScalarType>(dtype));
    out.emplace_back(layout.substr(at, name_end - at), at::empty(sizes, is_cuda ? options.device(cuda) : options));
    at = line_end + 1;
  }
  return out;
}

// Records that `owner` holds `name`, refusing a name that two owners hold (owner 0's root,
// building the whole list of a file or an index).
void claim_name(std::map<std::string, int>& owner_of, const std::string& name, int owner) {
  const auto [at, fresh] = owner_of.emplace(name, owner);
  TORCH_CHECK(fresh, "cpprun: a checkpoint of pipeline stages: \"", name, "\" is held by pipeline ranks ",
              at->second, " and ", owner, "; a name must belong to one stage.");
}

void append_owned(NamedTensors& all, std::map<std::string, int>& owner_of, const NamedTensors& theirs, int owner) {
  for (const auto& item : theirs) {
    claim_name(owner_of, item.first, owner);
    all.push_back(item);
  }
}

// Owner 0's root: every owner's tensors, received from each owner's root (in its order), each name
// claimed once; `failure` set on a name two owners hold. Elsewhere: nothing. Collective over the
// roots' owners group (Note [Teams and owners]).
NamedTensors gather_to_owner_zero(const NamedTensors& mine, const CheckpointTeam& team, const ProcessGroup& owners,
                                  std::exception_ptr& failure) {
  NamedTensors all;
  if (!team.is_root()) return all;  // every rank of this owners group, or none
  const auto layouts = all_gather_bytes(owners, describe_layout(mine));
  if (owners.rank() != 0) {
    for (const auto& [name, tensor] : mine) send(owners, tensor.contiguous(), 0, kTensorTag);
    return all;
  }
  std::map<std::string, int> owner_of;
  try {
    append_owned(all, owner_of, mine, 0);
  } catch (...) {
    failure = std::current_exception();
  }
  for (int owner = 1; owner < owners.size(); ++owner) {
    NamedTensors theirs = allocate_layout(layouts[static_cast<std::size_t>(owner)], mine);
    for (auto& [name, tensor] : theirs) recv(owners, tensor, owner, kTensorTag);  // in the sender's order
    if (failure) continue;
    try {
      append_owned(all, owner_of, theirs, owner);
    } catch (...) {
      failure = std::current_exception();
    }
  }
  return all;
}

void save_file(const NamedTensors& mine, const CheckpointTeam& team, const ProcessGroup& owners,
               const std::string& path, const StateDictSaveOptions& options,
               const std::map<std::string, std::string>& metadata, const std::string& what) {
  std::exception_ptr failure;
  const NamedTensors all = gather_to_owner_zero(mine, team, owners, failure);
  if (team.is_root() && owners.rank() == 0 && !failure) {
    try {
      write_state_dict_file(all, path, options, metadata);
    } catch (...) {
      failure = std::current_exception();
    }
  }
  // Also the barrier: the file exists when save returns, on every rank.
  agree_everywhere(team, owners, failure, what);
}

// Each tensor's file, for the index: what each of the owner's writers writes.
std::string weight_map_part(const NamedTensors& mine, const CheckpointTeam& team, std::string_view stem,
                            int files_before, int files_in_all) {
  std::string out;
  std::uint64_t bytes = 0;
  for (int writer = 0; writer < team.writers(); ++writer) {
    const StateDictShard shard = state_dict_shard(mine, writer, team.writers(), stem, files_before, files_in_all);
    for (const auto& [name, tensor] : shard.tensors) {
      out += name + '\0' + shard.file + '\0';
      bytes += tensor.nbytes();
    }
  }
  return std::to_string(bytes) + '\0' + out;
}

// Where this owner's files fall among all owners' (numbered owner after owner, each owner's among
// its writers). Collective over the owners group.
struct OwnedFiles {
  int before = 0;  // the owners' before this one
  int all = 0;
};
OwnedFiles number_owned_files(const NamedTensors& mine, const CheckpointTeam& team, const ProcessGroup& owners) {
  const auto files_of = all_gather_object(owners, shard_file_count(mine, team.writers()));
  return {std::accumulate(files_of.begin(), files_of.begin() + owners.rank(), 0),
          std::accumulate(files_of.begin(), files_of.end(), 0)};
}

// The index of every owner's files, on owner 0's root (`failure` set on a name two owners hold);
// empty elsewhere. Collective over the roots' owners group.
IndexPlan gather_owned_index(const NamedTensors& mine, const CheckpointTeam& team, const ProcessGroup& owners,
                             std::string_view stem, const OwnedFiles& files, std::exception_ptr& failure) {
  IndexPlan index;
  if (!team.is_root()) return index;
  const auto parts = all_gather_bytes(owners, weight_map_part(mine, team, stem, files.before, files.all));
  if (owners.rank() != 0) return index;
  try {
    std::map<std::string, int> owner_of;
    for (int owner = 0; owner < owners.size(); ++owner) {
      const std::string& part = parts[static_cast<std::size_t>(owner)];
      std::size_t at = part.find('\0');
      index.total_bytes += std::stoull(part.substr(0, at));
      for (++at; at < part.size();) {
        const std::size_t name_end = part.find('\0', at), file_end = part.find('\0', name_end + 1);
        const std::string name = part.substr(at, name_end - at);
        claim_name(owner_of, name, owner);
        index.weight_map[name] = part.substr(name_end + 1, file_end - name_end - 1);
        at = file_end + 1;
      }
    }
  } catch (...) {
    failure = std::current_exception();
  }
  return index;
}

void save_directory(const NamedTensors& mine, const CheckpointTeam& team, const ProcessGroup& owners,
                    const std::string& dir, const StateDictSaveOptions& options, std::string_view stem,
                    const std::map<std::string, std::string>& metadata, const std::string& what) {
  const std::set<std::string> stems{std::string(stem)};
  // One save id for every file, drawn by owner 0's root (Note [One save id for a model and its
  // optimizer]), then passed over the owners and each team.
  const bool decides = team.is_root() && owners.rank() == 0;
  ShardedSaveStamp stamp{decides ? claim_save_id(dir, options, stems) : std::string(), options.step(), metadata};
  broadcast_bytes(owners, stamp.save_id, 0);
  team.broadcast_bytes(stamp.save_id);
  const OwnedFiles files = number_owned_files(mine, team, owners);
  const StateDictShard shard =
      team.writes() ? state_dict_shard(mine, team.writer_rank(), team.writers(), stem, files.before, files.all)
                    : StateDictShard();
  // See Note [A failed save removes what it wrote] and Note [A failed save puts the previous files back].
  ReplacedFiles replaced;
  const auto undo = [&] {
    replaced.put_back();
    if (decides) forget_failed_save(dir, stamp.save_id, stems);
  };
  std::exception_ptr failure;
  const auto agree_or_undo = [&] {
    try {
      agree_everywhere(team, owners, failure, what);
    } catch (...) {
      undo();
      throw;
    }
  };
  if (decides) {
    try {
      create_checkpoint_directory(dir);
    } catch (...) {
      failure = std::current_exception();
    }
  }
  agree_or_undo();
  if (team.writes()) {
    try {
      write_state_dict_shard(shard, dir, stamp);
    } catch (...) {
      failure = std::current_exception();
    }
  }
  agree_or_undo();  // every file is in place before the index names them
  IndexPlan index = gather_owned_index(mine, team, owners, stem, files, failure);
  if (decides && !failure) {
    try {
      write_state_dict_index(std::move(index.weight_map), index.total_bytes, dir, stamp, stem);
    } catch (...) {
      failure = std::current_exception();
    }
  }
  agree_or_undo();
  replaced.done();
}

// What one owner's root found: its names, and what of them the checkpoint lacks or holds in
// another shape or dtype. Bytes: encode_report's three lists (missing, names, mismatched).
std::string encode_owner_part(const std::set<std::string>& names, const StateDictLoadReport& report) {
  return encode_report({report.missing_keys, {names.begin(), names.end()}, report.mismatched});
}

// Note [Tied copies held by several owners]
// A weight tied across pipeline stages on different ranks is one copy per owner, each under its own
// name, and each owner's root reads only its own names of the checkpoint: refuse_disagreeing_ties
// sees one of them, and a file whose tied names differ loaded each copy its own value (they then
// stayed apart). So each root shares a digest of the file's tensor under every tied name it found
// (its dtype, shape and bytes), and every root refuses a difference alike, before anything loads.
std::string digest_of(const at::Tensor& tensor) {
  const at::Tensor bytes = tensor.contiguous();
  const std::string_view data(static_cast<const char*>(bytes.data_ptr()), bytes.nbytes());
  return std::string(c10::toString(tensor.scalar_type())) + c10::str(tensor.sizes()) + ":" +
         std::to_string(std::hash<std::string_view>{}(data));
}

// Collective over the owners' roots (every one calls it, whether its read failed or not); sets
// `failure` where it is not set already. See Note [Tied copies held by several owners].
void refuse_disagreeing_copies(const NamedTensors& into, const NamedTensors& found,
                               const std::vector<std::vector<std::string>>& tied, const ProcessGroup& owners,
                               const std::string& path, std::exception_ptr& failure) {
  std::set<std::string> tied_names;
  for (const auto& names : tied) tied_names.insert(names.begin(), names.end());
  std::map<std::string, const at::Tensor*> module;
  for (const auto& [name, tensor] : into) module.emplace(name, &tensor);
  // name '\0' digest '\0', for each tied name this owner found whose file tensor fits the module's
  // (its dtype and shape): one that does not is left to the report, as refuse_disagreeing_ties
  // leaves it, and a strict(false) load fills that copy from one that loaded (fill_ties_held_once).
  std::string mine;
  for (const auto& [name, tensor] : found) {
    const auto own = module.find(name);
    const bool fits = own != module.end() && own->second->sizes() == tensor.sizes() &&
                      own->second->scalar_type() == tensor.scalar_type();
    if (tied_names.count(name) && fits) mine += name + '\0' + digest_of(tensor) + '\0';
  }
  const auto parts = all_gather_bytes(owners, mine);
  if (failure) return;
  std::map<std::string, std::string> digests;  // of every owner
  for (const auto& part : parts) {
    for (std::size_t at = 0; at < part.size();) {
      const std::size_t name_end = part.find('\0', at), digest_end = part.find('\0', name_end + 1);
      digests.emplace(part.substr(at, name_end - at), part.substr(name_end + 1, digest_end - name_end - 1));
      at = digest_end + 1;
    }
  }
  for (const auto& names : tied) {
    const std::string* first = nullptr;
    for (const auto& name : names) {
      const auto found_digest = digests.find(name);
      if (found_digest == digests.end()) continue;  // the checkpoint lacks it: see fill_ties_held_once
      if (first == nullptr) {
        first = &name;
      } else if (digests.at(*first) != found_digest->second) {
        try {
          throw_disagreeing_ties(path, *first, name);
        } catch (...) {
          failure = std::current_exception();
        }
        return;
      }
    }
  }
}

}  // namespace

void save_owned_state(const NamedTensors& mine, const CheckpointTeam& team, const ProcessGroup& owners,
                      const std::string& path, const StateDictSaveOptions& options, std::string_view stem,
                      const std::map<std::string, std::string>& metadata) {
  check_state_dict_path(path);  // before any collective: every rank refuses alike
  const std::string what =
      std::string(stem == kOptimizerStem ? "saving the optimizer state to " : "saving the state dict to ") + path;
  check_roots_line_up(team, owners, what);
  if (is_sharded_state_dict_path(path)) {
    save_directory(mine, team, owners, path, options, stem, metadata, what);
  } else {
    save_file(mine, team, owners, path, options, metadata, what);
  }
}

AsyncSave save_owned_state_async(std::vector<AsyncSavePart> parts, const CheckpointTeam& team,
                                 const ProcessGroup& owners, const StateDictSaveOptions& options) {
  TORCH_INTERNAL_ASSERT(!parts.empty(), "an asynchronous save of nothing");
  for (const auto& part : parts) check_state_dict_path(part.path);  // before any collective
  const std::string what = "the asynchronous save to " + parts.front().path;
  check_roots_line_up(team, owners, what);
  // One save id and one token for every file, drawn by owner 0's root, then passed over the
  // owners and each team (as save_directory's; a non-root owners group passes an empty one, which
  // its team's broadcast then replaces).
  const bool decides = team.is_root() && owners.rank() == 0;
  AsyncSaveRanks ranks{team, owners, std::string(), std::string(), decides};
  if (decides) {
    ranks.save_id = claim_parts_save_id(parts, options);
    ranks.token = new_save_id();
  }
  for (std::string* bytes : {&ranks.save_id, &ranks.token}) {
    broadcast_bytes(owners, *bytes, 0);
    team.broadcast_bytes(*bytes);
  }
  StateDictSaveOptions file_options = options;
  if (parts.size() > 1) file_options.save_id(ranks.save_id);
  // What moves between owners moves here, on the calling thread: a file's tensors to owner 0's
  // root, a directory's names for its index. Each writer copies what it writes.
  std::exception_ptr failure;
  std::vector<PreparedPart> prepared;
  for (auto& part : parts) {
    PreparedPart out = prepared_part(part, ranks.save_id, options.step());
    if (out.directory) {
      const OwnedFiles files = number_owned_files(part.state, team, owners);
      if (team.writes()) {
        out.shard = state_dict_shard(part.state, team.writer_rank(), team.writers(), part.stem, files.before, files.all);
        try {  // a failed copy (out of memory) is agreed on below, with the other failures
          out.shard.tensors = snapshot_state(out.shard.tensors, part.owned);
        } catch (...) {
          if (!failure) failure = std::current_exception();
        }
      }
      out.index = gather_owned_index(part.state, team, owners, part.stem, files, failure);
      out.writes_index = decides;
    } else {
      NamedTensors all = gather_to_owner_zero(part.state, team, owners, failure);
      if (decides) {
        out.writes_file = true;
        try {
          out.file_state = snapshot_state(all);
        } catch (...) {
          if (!failure) failure = std::current_exception();
        }
        out.metadata = std::move(part.metadata);
      }
    }
    prepared.push_back(std::move(out));
  }
  try {
    agree_everywhere(team, owners, failure, what);  // a name two stages hold: refused on every rank
  } catch (...) {
    if (decides) {
      for (const auto& part : prepared) {
        if (part.directory) forget_failed_save(part.path, ranks.save_id, {std::string(part.stem)});
      }
    }
    throw;
  }
  return launch_async_save(std::move(prepared), std::move(ranks), file_options);
}

StateDictLoadReport load_owned_state(const NamedTensors& into, const CheckpointTeam& team, const ProcessGroup& owners,
                                     const std::string& path, const StateDictOptions& options,
                                     const std::vector<std::vector<std::string>>& tied) {
  check_roots_line_up(team, owners, "loading the state dict from " + path);
  const std::string& prefix = options.file_key_prefix();  // with the consumed one: the file's names as the module's
  const std::string& consumed = options.consume_prefix_in_state_dict_if_present();
  std::exception_ptr failure;
  std::string verdict;  // "F" + the first owner's failure, or "R" + the report of the whole load
  NamedTensors found;   // the checkpoint's tensors of this owner's names
  if (team.is_root()) {
    std::set<std::string> names;
    for (const auto& [name, tensor] : into) names.insert(name);
    std::vector<std::string> in_checkpoint;  // every name the checkpoint holds, as the module's
    StateDictLoadReport mine;
    try {
      NamedTensors read;
      std::string single;  // a directory holding model.safetensors alone: that file
      const bool directory = is_sharded_state_dict_path(path);
      const std::string dir = directory ? sharded_load_directory(path, single) : std::string();
      if (directory && single.empty()) {
        // Only the files that hold this owner's names.
        std::set<std::string> wanted;
        for (const auto& name : names) {
          if (name.compare(0, prefix.size(), prefix) != 0) continue;
          const std::string rest = name.substr(prefix.size());
          wanted.insert(rest);  // the consumed prefix is taken away where present: either name
          if (!consumed.empty()) wanted.insert(consumed + rest);
        }
        ShardedDirectory files = read_sharded_directory(dir, kModelStem, &wanted);
        for (const auto& [name, file] : files.index.weight_map) in_checkpoint.push_back(as_module_name(name, options));
        read = std::move(files.tensors);
      } else {
        read = read_state_dict_file(single.empty() ? path : single);
        for (const auto& [name, tensor] : read) in_checkpoint.push_back(as_module_name(name, options));
      }
      for (auto& [name, tensor] : read) {
        const std::string as_module = as_module_name(name, options);
        if (names.count(as_module)) found.emplace_back(as_module, std::move(tensor));
      }
      mine = compare_state(into, found);  // its unexpected list is empty: found holds only our names
      refuse_disagreeing_ties(into, found, path);  // here, so every owner learns of it
    } catch (...) {
      failure = std::current_exception();
    }
    if (!tied.empty()) refuse_disagreeing_copies(into, found, tied, owners, path, failure);
    const auto parts = all_gather_bytes(owners, failure ? "F" + describe_failure(failure)
                                                        : "R" + encode_owner_part(names, mine));
    StateDictLoadReport whole;
    std::set<std::string> held;  // by any owner
    for (const auto& part : parts) {
      if (part[0] == 'F') {
        verdict = part;
        break;
      }
      StateDictLoadReport theirs = decode_report(part.substr(1));
      whole.missing_keys.insert(whole.missing_keys.end(), theirs.missing_keys.begin(), theirs.missing_keys.end());
      whole.mismatched.insert(whole.mismatched.end(), theirs.mismatched.begin(), theirs.mismatched.end());
      held.insert(theirs.unexpected_keys.begin(), theirs.unexpected_keys.end());  // their names
    }
    if (verdict.empty()) {
      for (const auto& name : in_checkpoint) {
        if (!held.count(name)) whole.unexpected_keys.push_back(name);
      }
      for (auto* list : {&whole.missing_keys, &whole.unexpected_keys, &whole.mismatched}) {
        std::sort(list->begin(), list->end());
      }
      verdict = "R" + encode_report(whole);
    }
  }
  team.broadcast_bytes(verdict);
  if (verdict[0] == 'F') {
    if (failure) std::rethrow_exception(failure);
    throw_described_failure(verdict.substr(1));
  }
  const StateDictLoadReport report = decode_report(verdict.substr(1));
  const bool differs = !report.missing_keys.empty() || !report.unexpected_keys.empty() || !report.mismatched.empty();
  if (options.strict() && differs) throw StateDictMismatchError(mismatch_message(report, path));
  if (team.is_root()) load_named_tensors(into, found, path, StateDictOptions().strict(false));  // what fits
  std::vector<at::Tensor> tensors;  // each once: a tied tensor is listed under each of its names
  std::unordered_set<const c10::TensorImpl*> listed;
  for (const auto& [name, tensor] : into) {
    if (listed.insert(tensor.unsafeGetTensorImpl()).second) tensors.push_back(tensor);
  }
  team.broadcast_tensors(tensors);
  return report;
}

}  // namespace cpprun::detail
