// See row_scatter.h.
#include "checkpoint/row_scatter.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "cpprun/collectives.h"
#include "cpprun/process_group.h"

namespace cpprun::detail {

// Note [The transfer's buffers are agreed]
// By the time tensors move in a parallel load, every check has been agreed and only memory can
// still fail: a rank failing to allocate a tensor's buffer partway through the transfer would
// raise alone, while the others waited in the next collective until the group's timeout with the
// model part loaded. So the loads plan every buffer the transfer needs on this rank before the
// first tensor moves, allocate them at once (TransferScratch: one flat tensor per dtype and
// device, as large as the largest tensor's need, for the buffers used one tensor at a time), and
// agree over the team that every rank allocated them: a rank out of memory fails the load on every
// rank, nothing changed. The peak is what it was (one tensor in flight), held for the whole
// transfer rather than per tensor. The optimizer's load allocates beside the scratch, and agrees
// with it, what it keeps: each state tensor's rows on this rank, and each tensor it receives
// whole. Not covered: the pack in which broadcast_coalesced sends small tensors together (at most
// 32 MiB, comm/collectives.cpp), allocated during the optimizer's broadcast.

std::optional<int> scatter_root(const StateEntry& entry, const CheckpointTeam& team, int reader) {
  if (!entry.placement.rows || entry.placement.tensor_parallel || !team.tensor_parallel().empty() || !team.replicas()) {
    return std::nullopt;
  }
  const std::vector<int> shard = get_process_group_ranks(entry.placement.rows->group);
  const std::vector<int> writers = get_process_group_ranks(*team.replicas());
  if (shard.size() != writers.size()) return std::nullopt;
  const auto at = std::find(shard.begin(), shard.end(), writers[static_cast<std::size_t>(reader)]);
  if (at == shard.end()) return std::nullopt;
  return static_cast<int>(at - shard.begin());
}

TransferScratch::Key TransferScratch::key(at::ScalarType dtype, c10::Device device) {
  return {dtype, device.type(), device.index()};
}

void TransferScratch::need(at::ScalarType dtype, c10::Device device, int64_t numel) {
  int64_t& largest = largest_[key(dtype, device)];
  largest = std::max(largest, numel);
}

void TransferScratch::allocate() {
  for (const auto& [k, numel] : largest_) {
    const auto& [dtype, type, index] = k;
    if (numel > 0) buffers_[k] = at::empty({numel}, at::TensorOptions().dtype(dtype).device(c10::Device(type, index)));
  }
}

at::Tensor TransferScratch::view(at::ScalarType dtype, c10::Device device, int64_t offset, int64_t numel) const {
  if (numel == 0) return at::empty({0}, at::TensorOptions().dtype(dtype).device(device));  // nothing planned
  const auto found = buffers_.find(key(dtype, device));
  TORCH_INTERNAL_ASSERT(found != buffers_.end() && offset + numel <= found->second.numel(),
                        "a transfer's buffer was used beyond what was planned");
  return found->second.narrow(0, offset, numel);
}

namespace {

// Chunks [0, full) lie inside the whole; chunk `full` holds its last `past_full` elements, when
// any are left, zero-padded; every later chunk is zeros only (one zero chunk, sent to each).
struct Chunks {
  int64_t ranks = 0;      // of the shard group
  int64_t chunk = 0;      // elements a rank receives
  int64_t full = 0;       // chunks that lie inside the whole
  int64_t past_full = 0;  // elements of the whole after them
  bool partial() const { return past_full > 0; }
  bool zeros() const { return full + (partial() ? 1 : 0) < ranks; }
  int64_t padded_numel() const { return ((partial() ? 1 : 0) + (zeros() ? 1 : 0)) * chunk; }
};

Chunks chunks_of(const StateEntry& entry) {
  const RowShard& rows = *entry.placement.rows;
  const int64_t numel = rows.rows * rows.row_numel;
  Chunks c;
  c.ranks = rows.group.size();
  c.chunk = rows.rows_per_rank * rows.row_numel;
  c.full = c.chunk == 0 ? c.ranks : std::min<int64_t>(numel / c.chunk, c.ranks);
  c.past_full = numel - c.full * c.chunk;
  return c;
}

// Whether the root's tensor is sent as it is (else copied into the scratch first).
bool sendable(const at::Tensor& whole, c10::Device device) { return whole.device() == device && whole.is_contiguous(); }

}  // namespace

int64_t scatter_chunk_numel(const StateEntry& entry) { return chunks_of(entry).chunk; }

int64_t scatter_send_numel(const StateEntry& entry, const at::Tensor& whole) {
  return (sendable(whole, entry.device) ? 0 : whole.numel()) + chunks_of(entry).padded_numel();
}

at::Tensor scatter_rows(const StateEntry& entry, int root, const at::Tensor& whole, const at::Tensor& scratch,
                        const at::Tensor& received) {
  const RowShard& rows = *entry.placement.rows;
  const Chunks c = chunks_of(entry);
  std::vector<at::Tensor> inputs;
  at::Tensor output = received;
  if (whole.defined()) {
    // Views of the tensor read (a copy only where it is not on the device, or not contiguous);
    // its last elements copied into one zero-padded chunk, and one chunk of zeros for the ranks
    // past its end (Gloo and NCCL take one tensor as several inputs).
    const int64_t numel = whole.numel();
    TORCH_INTERNAL_ASSERT(numel == rows.rows * rows.row_numel, "a scattered tensor is not the entry's whole");
    int64_t offset = 0;
    at::Tensor flat;
    if (sendable(whole, entry.device)) {
      flat = whole.view({-1});
    } else {
      flat = scratch.narrow(0, 0, numel);
      flat.view(whole.sizes()).copy_(whole);
      offset = numel;
    }
    at::Tensor partial, zeros;
    if (c.partial()) {
      partial = scratch.narrow(0, offset, c.chunk);
      partial.narrow(0, 0, c.past_full).copy_(flat.narrow(0, c.full * c.chunk, c.past_full));
      partial.narrow(0, c.past_full, c.chunk - c.past_full).zero_();
      offset += c.chunk;
    }
    if (c.zeros()) zeros = scratch.narrow(0, offset, c.chunk).zero_();
    for (int64_t r = 0; r < c.ranks; ++r) {
      inputs.push_back(r < c.full ? flat.narrow(0, r * c.chunk, c.chunk) : r == c.full && c.partial() ? partial : zeros);
    }
    output = inputs[static_cast<std::size_t>(root)];  // the root's own rows, in place
  }
  cpprun::scatter(rows.group, output, std::move(inputs), root);
  return output.narrow(0, 0, rows.local_rows * rows.row_numel).view(rows.local_sizes);
}

}  // namespace cpprun::detail
