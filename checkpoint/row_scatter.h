// FSDP's rows of a tensor that one rank read from a file, sent to the ranks that hold them: the
// scatter of a parallel directory load (checkpoint/parallel_load.h for the model,
// checkpoint/optimizer_state_dict.cpp for the optimizer's state). Rank r of the entry's shard group
// receives chunk r of the whole, flattened, the last chunks padded to the same size; a rank other
// than the reader holds only its rows, never the whole tensor. The buffers it passes through are planned before the
// transfer starts and allocated at once (TransferScratch), so that a rank out of memory fails
// before any rank waits in a scatter (Note [The transfer's buffers are agreed] in the .cpp).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <map>
#include <optional>
#include <tuple>

#include "checkpoint/checkpoint_team.h"
#include "checkpoint/state_view.h"

namespace cpprun::detail {

// The rank of the entry's shard group that holds writer `reader`, when the entry's rows are
// scattered from it: FSDP's rows over a group of every writer of the team (not HSDP's replicas,
// nor tensor-parallel splits); nullopt: the tensor goes whole (broadcast) and each rank cuts its
// part. The same on every rank.
std::optional<int> scatter_root(const StateEntry& entry, const CheckpointTeam& team, int reader);

// One flat buffer per dtype and device, as large as the largest need declared: what a transfer's
// tensors pass through, allocated before the first moves.
class TransferScratch {
 public:
  void need(at::ScalarType dtype, c10::Device device, int64_t numel);
  // Throws what the allocator throws (out of memory); the caller agrees it over the team.
  void allocate();
  // `numel` elements from `offset` of the buffer of this dtype and device.
  at::Tensor view(at::ScalarType dtype, c10::Device device, int64_t offset, int64_t numel) const;

 private:
  using Key = std::tuple<at::ScalarType, c10::DeviceType, c10::DeviceIndex>;
  static Key key(at::ScalarType dtype, c10::Device device);
  std::map<Key, int64_t> largest_;
  std::map<Key, at::Tensor> buffers_;
};

// What a rank receives of the entry's rows: one chunk, in elements.
int64_t scatter_chunk_numel(const StateEntry& entry);
// What the root needs beyond `whole` to send it (elements of whole's dtype on entry.device): a
// copy when `whole` is not there or not contiguous, its last rows zero-padded to a chunk, and one
// chunk of zeros for the ranks past its end: at most the whole and two chunks.
int64_t scatter_send_numel(const StateEntry& entry, const at::Tensor& whole);

// Collective over the entry's shard group (rows->group), with `root` as scatter_root gave it. On
// the root, `whole` is the tensor read (of the entry's whole shape) and `scratch` holds at least
// scatter_send_numel elements; elsewhere `received` holds scatter_chunk_numel elements, of the
// dtype the root sends, on entry.device. Returns this rank's rows in the local tensor's shape: a
// view into `received`, or on the root into `whole` or `scratch` (valid until they are reused).
at::Tensor scatter_rows(const StateEntry& entry, int root, const at::Tensor& whole, const at::Tensor& scratch,
                        const at::Tensor& received);

}  // namespace cpprun::detail
