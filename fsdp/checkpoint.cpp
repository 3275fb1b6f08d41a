// See checkpoint.h.
#include "fsdp/checkpoint.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/serialize/archive.h>

#include <algorithm>
#include <functional>
#include <filesystem>
#include <map>

#include "cpprun/checkpoint_file.h"
#include "cpprun/collectives.h"
#include "fsdp/failure_agreement.h"
#include "fsdp/optimizer_state.h"

namespace cpprun::detail {
namespace fs = std::filesystem;
namespace {

std::string rank_file(const std::string& dir, int rank) { return (fs::path(dir) / ("rank_" + std::to_string(rank) + ".pt")).string(); }
std::string meta_file(const std::string& dir) { return (fs::path(dir) / "meta.pt").string(); }
std::string key(std::size_t flat, const std::string& what) { return "u" + std::to_string(flat) + "." + what; }

int64_t read_int(torch::serialize::InputArchive& archive, const std::string& name) {
  at::Tensor t;
  archive.read(name, t);
  return t.item<int64_t>();
}

c10::IValue names_of(const FlatParam& flat) {
  c10::List<std::string> names;
  for (const auto& n : flat.names()) names.push_back(n);
  return names;
}

// Reads `archive` into `module`'s tensors in place (Module::load would replace their storage,
// which here is a flat parameter's).
void copy_in(torch::nn::Module& module, torch::serialize::InputArchive& archive) {
  at::NoGradGuard no_grad;
  for (auto& item : module.named_parameters(/*recurse=*/false)) {
    at::Tensor value;
    archive.read(item.key(), value);
    TORCH_CHECK(value.sizes() == item.value().sizes(), "cpprun::FullyShardedDataParallel: checkpoint tensor \"",
                item.key(), "\" has shape ", value.sizes(), " but the module's has ", item.value().sizes(), ".");
    item.value().copy_(value);
  }
  for (auto& item : module.named_buffers(/*recurse=*/false)) {
    at::Tensor value;
    archive.read(item.key(), value, /*is_buffer=*/true);
    item.value().copy_(value);
  }
  for (auto& child : module.named_children()) {
    torch::serialize::InputArchive sub;
    archive.read(child.key(), sub);
    copy_in(*child.value(), sub);
  }
}

}  // namespace

void broadcast_module_state(torch::nn::Module& module, const ProcessGroup& group) {
  std::vector<at::Tensor> state;
  for (const auto& p : module.parameters()) state.push_back(p);
  for (const auto& b : module.buffers()) state.push_back(b);
  broadcast_coalesced(group, state, 0);
}

void save_full_state(torch::nn::Module& module, const ProcessGroup& group, const std::string& path) {
  std::exception_ptr failure;
  if (group.rank() == 0) {
    try {
      torch::serialize::OutputArchive archive;
      module.save(archive);
      save_checkpoint(archive, path);  // atomic, with a checksum; torch::load still reads it
    } catch (...) {
      failure = std::current_exception();
    }
  }
  // Also the barrier: the file exists when save returns, on every rank.
  agree_on_failure(group, failure, "saving the full state dict to " + path);
}

void load_full_state(torch::nn::Module& module, std::vector<FlatParam>& flats, const ProcessGroup& group,
                     const std::string& path) {
  std::exception_ptr failure;
  if (group.rank() == 0) {
    try {
      torch::serialize::InputArchive archive;
      // Our own files are checked; one torch::save wrote carries no checksum and is read as it is.
      load_checkpoint(archive, path, UncheckedFiles::kAccept);
      copy_in(module, archive);
    } catch (...) {
      failure = std::current_exception();
    }
  }
  // Only rank 0 reads: the others must not wait for its broadcast if it could not.
  agree_on_failure(group, failure, "loading the full state dict from " + path);
  broadcast_module_state(module, group);
  // Where a shard is not a part of the full parameters (stage 3, mixed precision), copy it over.
  for (auto& flat : flats) flat.shard_from_full();
}

namespace {

// This rank's shards and their optimizer state, to PATH.
void write_shards(const std::vector<FlatParam>& flats, torch::optim::Optimizer* optimizer, const std::string& path) {
  torch::serialize::OutputArchive archive;
  for (std::size_t f = 0; f < flats.size(); ++f) {
    archive.write(key(f, "shard"), flats[f].shard().detach());
    if (!optimizer) continue;
    if (auto state = read_optimizer_state(*optimizer, flats[f].shard())) {
      c10::List<std::string> names;
      for (const auto& [name, tensor] : state->tensors) {
        archive.write(key(f, "opt." + name), tensor);
        names.push_back(name);
      }
      archive.write(key(f, "opt.names"), names);
      archive.write(key(f, "opt.step"), at::tensor(state->step));
    }
  }
  save_checkpoint(archive, path);
}

}  // namespace

void save_sharded_checkpoint(const std::vector<FlatParam>& flats, const ShardGroups& groups,
                             torch::optim::Optimizer* optimizer, const std::string& dir) {
  const ProcessGroup& group = groups.whole;
  std::exception_ptr failure;
  try {
    fs::create_directories(dir);
    if (groups.first_replica()) write_shards(flats, optimizer, rank_file(dir, groups.shard.rank()));
  } catch (...) {
    failure = std::current_exception();
  }
  // Every rank's file is in place before meta.pt says the checkpoint is whole.
  agree_on_failure(group, failure, "saving the sharded checkpoint in " + dir);
  if (group.rank() == 0) {
    try {
      torch::serialize::OutputArchive meta;
      meta.write("world_size", at::tensor(static_cast<int64_t>(groups.shard.size())));
      meta.write("units", at::tensor(static_cast<int64_t>(flats.size())));  // flat parameters; the key is kept for old files
      for (std::size_t f = 0; f < flats.size(); ++f) {
        meta.write(key(f, "numel"), at::tensor(flats[f].numel()));
        meta.write(key(f, "names"), names_of(flats[f]));
      }
      save_checkpoint(meta, meta_file(dir));
    } catch (...) {
      failure = std::current_exception();
    }
  }
  agree_on_failure(group, failure, "saving the sharded checkpoint in " + dir);
}

// Note [Resharding a checkpoint]
// Saved on W ranks, flat parameter f was cut into W shards of S' = padded'/W elements; now
// this rank owns elements [r*S, r*S + S). It reads only the saved ranks whose shards overlap that
// range and copies the overlaps; elements past its real size are padding and stay zero.
void load_sharded_checkpoint(const std::vector<FlatParam>& flats, const ShardGroups& groups,
                             torch::optim::Optimizer* optimizer, const std::string& dir) {
  const ProcessGroup& group = groups.whole;
  // Each rank reads the files it needs: one may find a damaged file that the others never open.
  std::exception_ptr failure;
  try {
    TORCH_CHECK(fs::exists(meta_file(dir)), "cpprun: ", dir, " holds no complete sharded checkpoint (no meta.pt: ",
                "the save did not finish, or this is not a checkpoint directory).");
    torch::serialize::InputArchive meta;
    load_checkpoint(meta, meta_file(dir));
    const int64_t saved_world = read_int(meta, "world_size");
    TORCH_CHECK(read_int(meta, "units") == static_cast<int64_t>(flats.size()), "cpprun: the checkpoint in ", dir, " has ",
                read_int(meta, "units"), " flat parameters but this model has ", flats.size(),
                "; it was saved from another model or another unit plan (wrap_policy / auto_wrap_min_params).");
    for (std::size_t f = 0; f < flats.size(); ++f) {
      c10::IValue names;
      meta.read(key(f, "names"), names);
      const auto saved = names.toList();
      TORCH_CHECK(read_int(meta, key(f, "numel")) == flats[f].numel() && saved.size() == flats[f].names().size(),
                  "cpprun: flat parameter ", f, " of the checkpoint in ", dir, " does not match this model's (",
                  read_int(meta, key(f, "numel")), " elements saved, ", flats[f].numel(), " here).");
      for (std::size_t i = 0; i < saved.size(); ++i) {
        const std::string name = saved.get(i).toStringRef();
        TORCH_CHECK(name == flats[f].names()[i], "cpprun: the checkpoint in ", dir, " has parameter \"", name,
                    "\" where this model has \"", flats[f].names()[i], "\".");
      }
    }

    std::map<int64_t, torch::serialize::InputArchive> saved_ranks;  // opened on first need
    auto archive_of = [&](int64_t q) -> torch::serialize::InputArchive& {
      auto it = saved_ranks.find(q);
      if (it == saved_ranks.end()) {
        it = saved_ranks.emplace(q, torch::serialize::InputArchive()).first;
        load_checkpoint(it->second, rank_file(dir, static_cast<int>(q)));
      }
      return it->second;
    };

    // Open (and check) every file this rank needs before changing a shard: a damaged file leaves
    // the model as it was.
    auto overlapping_ranks = [&](const FlatParam& flat, const std::function<void(int64_t)>& fn) {
      const int64_t saved_shard = (flat.numel() + saved_world - 1) / saved_world;
      const int64_t lo = flat.shard_offset(), hi = std::min(lo + flat.shard_numel(), flat.numel());
      for (int64_t q = lo / saved_shard; q < saved_world && q * saved_shard < hi; ++q) {
        if (std::max(lo, q * saved_shard) < std::min(hi, (q + 1) * saved_shard)) fn(q);
      }
    };
    for (const FlatParam& flat : flats) overlapping_ranks(flat, [&](int64_t q) { archive_of(q); });

    at::NoGradGuard no_grad;
    for (std::size_t f = 0; f < flats.size(); ++f) {
      const FlatParam& flat = flats[f];
      const int64_t saved_padded = (flat.numel() + saved_world - 1) / saved_world * saved_world;
      const int64_t saved_shard = saved_padded / saved_world;
      const int64_t lo = flat.shard_offset(), hi = std::min(lo + flat.shard_numel(), flat.numel());
      at::Tensor shard = flat.shard().detach();
      shard.zero_();
      std::optional<ParamOptimizerState> state;
      for (int64_t q = lo / saved_shard; q < saved_world && q * saved_shard < hi; ++q) {
        const int64_t from = std::max(lo, q * saved_shard), to = std::min(hi, (q + 1) * saved_shard);
        if (from >= to) continue;
        auto& archive = archive_of(q);
        at::Tensor saved;
        archive.read(key(f, "shard"), saved);
        shard.narrow(0, from - lo, to - from).copy_(saved.narrow(0, from - q * saved_shard, to - from));
        c10::IValue names;
        if (!optimizer || !archive.try_read(key(f, "opt.names"), names)) continue;
        if (!state) {
          state.emplace();
          state->step = read_int(archive, key(f, "opt.step"));
        }
        for (const auto& name : names.toList()) {
          const std::string n = c10::IValue(name).toStringRef();
          at::Tensor piece;
          archive.read(key(f, "opt." + n), piece);
          auto& whole = state->tensors[n];
          if (!whole.defined()) whole = at::zeros_like(shard);
          whole.narrow(0, from - lo, to - from).copy_(piece.narrow(0, from - q * saved_shard, to - from));
        }
      }
      if (optimizer && state) write_optimizer_state(*optimizer, flat.shard(), *state);
    }
  } catch (...) {
    failure = std::current_exception();
  }
  agree_on_failure(group, failure, "loading the sharded checkpoint in " + dir);
}

}  // namespace cpprun::detail
