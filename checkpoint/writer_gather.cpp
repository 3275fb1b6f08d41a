// See writer_gather.h.
#include "checkpoint/writer_gather.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <exception>
#include <map>
#include <optional>
#include <tuple>

#include "checkpoint/async_save.h"
#include "checkpoint/rows_in_place.h"
#include "checkpoint/sharded_state_dict.h"
#include "checkpoint/writer_plan.h"
#include "cpprun/collectives.h"
#include "cpprun/process_group.h"
#include "support/safetensors_index.h"

namespace cpprun::detail {
namespace {

// Note [Gathering to the writer]
// How a pipeline stage's save gathers (a wrapper's save, synchronous or asynchronous, has each rank
// write its own rows instead: `in_place`, Note [Each rank writes its own rows] in rows_in_place.cpp). Which
// writer writes which tensor follows from the tensors' sizes alone (writer_plan.h), so every rank
// knows it before any gather. A tensor FSDP shards by rows over a shard group is gathered (c10d
// gather) to the shard group's rank that is its writer; a shard group holding no writer of it
// (HSDP's other replicas; a tensor-parallel slice other than the first, whose ranks write nothing)
// skips it: every rank of a group skips alike, so each group's collectives stay in one order. A
// tensor split by tensor parallelism takes the all-gathers of gather_whole on every rank, as
// before, and is kept where it is written. The writers allocate every buffer they will fill before
// the first gather, and the team agrees on that, so that one rank's failed allocation fails every
// rank at once rather than leaving its peers in a gather it never joins; the loop of gathers then
// allocates nothing but what Gloo's gather holds for one tensor on its root. An asynchronous save
// (WholeTensors::kOwned) keeps the gathered buffers as its own, with no copy: nothing else refers
// to them, so training may change the parameters once the call returns (a wrapper's rows written in
// place are its caller's to copy); only a piece held whole (replicated: the module's or the
// optimizer's own tensor) is copied, in that allocation step (and so under its agreement, DDP's
// too), and a tensor-parallel gather's result where it is the local tensor itself. A buffer on a
// GPU stays there: the snapshot of the save's files (checkpoint/async_save.h) copies it to the CPU.
// So its extra memory is the synchronous save's: the writer's own file.
enum class Way {
  kLocal,       // whole on every rank (replicated, or a 0-d step)
  kToWriters,   // rows over a shard group: gathered to each writer in this rank's shard group
  kEverywhere,  // tensor-parallel placement: gather_whole on every rank
};

// A gather of one piece to `root`, a rank of the piece's shard group.
struct Gather {
  std::size_t piece;
  int root;
};

std::vector<int64_t> whole_sizes(const SavePiece& p) {
  if (p.entry && !p.entry->placement.replicated()) return p.entry->whole_sizes;
  return p.local.sizes().vec();
}

bool replicated(const SavePiece& p) { return !p.entry || p.entry->placement.replicated(); }

int64_t chunk_numel(const RowShard& rows) { return rows.rows_per_rank * rows.row_numel; }

}  // namespace

NamedTensors gather_for_writers(const std::vector<SavePiece>& pieces,
                                const std::vector<std::pair<std::string, std::size_t>>& names,
                                const CheckpointTeam& team, const std::string& what, WholeTensors hold,
                                RowsInPlace* in_place) {
  at::NoGradGuard no_grad;
  // The plan: every rank computes the same from sizes alone.
  std::vector<std::uint64_t> name_bytes;
  std::vector<std::size_t> piece_of_name;
  for (const auto& [name, p] : names) {
    const SavePiece& piece = pieces[p];
    int64_t numel = 1;
    for (const int64_t size : whole_sizes(piece)) numel *= size;
    name_bytes.push_back(static_cast<std::uint64_t>(numel) * piece.local.element_size());
    piece_of_name.push_back(p);
  }
  const std::vector<std::vector<int>> writers_of = writers_of_pieces(name_bytes, piece_of_name, pieces.size(), team.writers());
  const int me = team.writes() ? team.writer_rank() : -1;
  const auto writes = [&](std::size_t p) {
    return std::find(writers_of[p].begin(), writers_of[p].end(), me) != writers_of[p].end();
  };
  const std::vector<int> writer_ranks =  // writer index -> the job's rank
      team.replicas() ? get_process_group_ranks(*team.replicas()) : std::vector<int>{};

  // What this rank does for each piece, and the buffers it fills.
  std::vector<Way> way(pieces.size(), Way::kLocal);
  std::vector<Gather> gathers;
  std::vector<at::Tensor> whole(pieces.size());
  for (std::size_t p = 0; p < pieces.size(); ++p) {
    const SavePiece& piece = pieces[p];
    if (replicated(piece)) {
      if (writes(p)) whole[p] = piece.local;
      continue;
    }
    if (piece.entry->placement.tensor_parallel || !piece.entry->placement.rows || writer_ranks.empty()) {
      way[p] = Way::kEverywhere;
      continue;
    }
    way[p] = Way::kToWriters;
    if (!team.writes()) continue;  // See Note [Gathering to the writer]: this slice writes nothing
    if (in_place) continue;        // each rank writes its rows (below)
    const std::vector<int> shard_ranks = get_process_group_ranks(piece.entry->placement.rows->group);
    for (const int w : writers_of[p]) {
      const auto at = std::find(shard_ranks.begin(), shard_ranks.end(), writer_ranks[static_cast<std::size_t>(w)]);
      if (at != shard_ranks.end()) gathers.push_back({p, static_cast<int>(at - shard_ranks.begin())});
    }
  }
  if (in_place) {  // See Note [Each rank writes its own rows] in checkpoint/rows_in_place.cpp
    in_place->used = std::find(way.begin(), way.end(), Way::kToWriters) != way.end();
    in_place->mine.clear();
    const std::vector<int> writer_of_name = partition_by_bytes(name_bytes, team.writers());  // the files' plan
    for (std::size_t i = 0; i < names.size() && team.writes(); ++i) {
      const std::size_t p = names[i].second;
      if (way[p] != Way::kToWriters) continue;
      const RowShard& rows = *pieces[p].entry->placement.rows;
      const int writer = writer_of_name[i];
      const std::vector<int> shard_ranks = get_process_group_ranks(rows.group);
      const bool shard_group_writes = std::find(shard_ranks.begin(), shard_ranks.end(),
                                                writer_ranks[static_cast<std::size_t>(writer)]) != shard_ranks.end();
      if (!shard_group_writes || rows.local_rows == 0) continue;  // another replica's rows, or none
      const auto first_byte = static_cast<std::uint64_t>(rows.first_row * rows.row_numel) * pieces[p].local.element_size();
      in_place->mine.push_back({i, pieces[p].local, first_byte, writer});
    }
  }
  std::map<std::size_t, at::Tensor> buffer;  // piece -> its padded whole, on the writer
  std::map<std::tuple<at::ScalarType, c10::DeviceType, c10::DeviceIndex>, at::Tensor> scratch;  // this rank's rows
  std::exception_ptr failure;
  try {
    if (hold == WholeTensors::kOwned) {
      for (std::size_t p = 0; p < pieces.size(); ++p) {
        if (way[p] == Way::kLocal && whole[p].defined()) whole[p] = snapshot_tensor(whole[p]);
      }
    }
    std::map<std::tuple<at::ScalarType, c10::DeviceType, c10::DeviceIndex>, int64_t> scratch_numel;
    for (const Gather& g : gathers) {
      const SavePiece& piece = pieces[g.piece];
      const RowShard& rows = *piece.entry->placement.rows;
      const auto options = piece.local.options().device(piece.entry->device);
      if (rows.group.rank() == g.root) buffer[g.piece] = at::empty({chunk_numel(rows) * rows.group.size()}, options);
      int64_t& numel = scratch_numel[{options.dtype().toScalarType(), options.device().type(), options.device().index()}];
      numel = std::max(numel, chunk_numel(rows));
    }
    for (const auto& [key, numel] : scratch_numel) {
      const auto& [dtype, type, index] = key;
      scratch[key] = at::empty({numel}, at::TensorOptions().dtype(dtype).device(c10::Device(type, index)));
    }
  } catch (...) {
    failure = std::current_exception();
  }
  // Every rank sees the same placements and `hold`, so all or none agree (a synchronous DDP save
  // allocates nothing here: no agreement; an asynchronous one copies what its writers hold).
  if (hold == WholeTensors::kOwned || (!in_place && std::find(way.begin(), way.end(), Way::kToWriters) != way.end())) {
    team.agree(failure, what + " (allocating the tensors each rank writes)");
  } else if (failure) {
    std::rethrow_exception(failure);
  }

  // The gathers, in the pieces' order on every rank.
  std::size_t next = 0;
  for (std::size_t p = 0; p < pieces.size(); ++p) {
    const SavePiece& piece = pieces[p];
    if (way[p] == Way::kEverywhere) {
      at::Tensor t = gather_whole(*piece.entry, piece.local);
      if (hold == WholeTensors::kOwned && writes(p) && t.is_alias_of(piece.local)) t = snapshot_tensor(t);
      if (writes(p)) whole[p] = std::move(t);
      continue;
    }
    for (; next < gathers.size() && gathers[next].piece == p; ++next) {
      const RowShard& rows = *piece.entry->placement.rows;
      const auto device = c10::Device(piece.entry->device);
      at::Tensor chunk =
          scratch.at({piece.local.scalar_type(), device.type(), device.index()}).narrow(0, 0, chunk_numel(rows));
      const int64_t mine = rows.local_rows * rows.row_numel;
      if (mine > 0) chunk.narrow(0, 0, mine).copy_(piece.local.detach().reshape({-1}));
      if (mine < chunk.numel()) chunk.narrow(0, mine, chunk.numel() - mine).zero_();
      std::vector<at::Tensor> outputs;
      const bool root = rows.group.rank() == gathers[next].root;
      if (root) {
        const at::Tensor& all = buffer.at(p);
        for (int r = 0; r < rows.group.size(); ++r) outputs.push_back(all.narrow(0, r * chunk.numel(), chunk.numel()));
      }
      gather(rows.group, chunk, std::move(outputs), gathers[next].root);
      if (root) whole[p] = buffer.at(p).narrow(0, 0, rows.rows * rows.row_numel).view(rows.sizes);
    }
  }

  NamedTensors out;
  out.reserve(names.size());
  for (const auto& [name, p] : names) {
    if (whole[p].defined()) {
      out.emplace_back(name, whole[p]);
    } else {
      out.emplace_back(name, at::empty(whole_sizes(pieces[p]), pieces[p].local.options().device(at::kMeta)));
    }
  }
  return out;
}

NamedTensors gather_view_for_writers(const StateView& view, const std::string& what, WholeTensors hold,
                                     RowsInPlace* in_place) {
  std::vector<SavePiece> pieces;
  pieces.reserve(view.entries.size());
  for (const auto& entry : view.entries) pieces.push_back({&entry, entry.local});
  return gather_for_writers(pieces, view.names, view.team, what, hold, in_place);
}

NamedTensors state_to_save(const StateView& view, const std::string& path, WholeTensors hold, RowsInPlace* in_place) {
  if (!is_sharded_state_dict_path(path)) return whole_state(view);
  NamedTensors state = gather_view_for_writers(view, "saving the state dict to " + path, hold, in_place);
  if (view.team.writers() >= 2) use_root_buffers(view, state);  // copies: the save's own
  return state;
}

}  // namespace cpprun::detail
