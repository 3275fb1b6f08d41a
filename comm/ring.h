// Reduce-scatter and all-gather as rings over send/recv, straight into the caller's tensors.
// Measured on LibTorch 2.15 (docs/process_groups.md, "Collectives"): 3-4x faster than Gloo's own
// reduce_scatter_single / all_gather_single, which go through scratch copies of the whole tensor.
#pragma once

#include <ATen/core/Tensor.h>

#include <atomic>
#include <chrono>
#include <cstdint>

#include "comm/c10d_types.h"
#include "cpprun/collectives.h"

namespace cpprun::detail {

struct Ring {
  C10dGroup* group = nullptr;
  int rank = 0;
  int size = 1;
  uint32_t op_index = 0;  // distinguishes this op's messages from any other op's
  ReduceOp op = ReduceOp::kSum;  // reduce-scatter only
  std::chrono::milliseconds timeout{};
  std::atomic<uint64_t>* bytes_sent = nullptr;  // optional tally of what this rank sent
  // This rank's call (comm/collective_fingerprint.h): checked against the previous rank's
  // before its first data is used. See Note [Ring neighbour check].
  at::Tensor call;
};

// Both throw c10::Error, before using any data, when the previous rank in the ring called a
// different collective or one of another size, dtype or reduce op.

// Blocks until `output` holds the reduction of every rank's chunk `rank` of `input`. Each rank
// sends and receives (size-1)/size of `input`, as a native reduce-scatter would; all-reduce
// followed by slicing would move twice that.
void run_ring_reduce_scatter(const Ring& ring, at::Tensor output, at::Tensor input);

// Blocks until `output` (size x input, contiguous) holds every rank's `input`, in rank order.
// Each rank sends and receives (size-1)/size of `output`, straight between the tensors: no
// scratch copy.
void run_ring_all_gather(const Ring& ring, at::Tensor output, at::Tensor input);

}  // namespace cpprun::detail
