// Reduce-scatter and all-gather as rings over send/recv, straight into the caller's tensors.
// Measured on LibTorch 2.15 (docs/process_groups.md, "Collectives"): 3-4x faster than Gloo's own
// reduce_scatter_single / all_gather_single, which go through scratch copies of the whole tensor.
// The chunked forms take a tensor that exists only as pieces (e.g. FSDP's parameters, each in
// its own place): each chunk travels as a few messages, and a message that is one piece is sent
// from it or received into it with no copy; only messages made of several small pieces are
// staged, copied while the next transfer runs. No tensor of the whole size is ever made.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Stream.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

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
  // The stream the caller issued from, for CUDA tensors: the ring's copies and sums run on it (the
  // executor thread makes it current), so they follow what the caller wrote before the call and
  // precede what the caller issues after waiting, with no device-wide synchronisation.
  // See Note [CUDA tensors over Gloo's send/recv] in comm/ring.cpp.
  std::optional<c10::Stream> stream;
};

// One piece of a chunk: `values` (contiguous) holds the chunk's elements [offset, offset + numel).
struct ChunkPiece {
  int64_t offset = 0;
  at::Tensor values;
};

// A tensor of `size` equal chunks of `chunk_numel` elements, chunk q made of chunks[q]'s pieces
// (in any order, not overlapping). Elements no piece covers are padding: zeros when sent,
// dropped when received.
//
// Each chunk moves as messages [message_starts[k], message_starts[k+1]) (the last to the chunk's
// end; none given: one message). Every rank must give the same starts, and no piece may cross
// one: a message that is exactly one piece of the collective's dtype goes straight from or into
// it. (Gloo's receive takes one tensor, so a piece per message is how the wire reaches pieces.)
//
// `pieces_are_scratch` (reduce-scatter only): the caller drops the pieces afterwards (FSDP's
// gradients), so the ring may add the partials it receives into them and send them on from
// there: no staging buffer of the chunk's size is needed (see Note [Ring reduce-scatter schedule]).
struct ChunkedTensor {
  int64_t chunk_numel = 0;
  std::vector<std::vector<ChunkPiece>> chunks;
  std::vector<int64_t> message_starts;
  bool pieces_are_scratch = false;
};

// Message starts for a chunk laid out as consecutive extents (offset, numel), e.g. a bucket's
// parameters: one message per extent of at least `min_message_bytes`, and the extents between
// them grouped into messages of about that size (a message costs a round of Gloo's bookkeeping,
// which for a LayerNorm's few hundred bytes costs more than copying them).
std::vector<int64_t> message_starts_for(const std::vector<std::pair<int64_t, int64_t>>& extents,
                                        int64_t element_size, int64_t min_message_bytes = 256 * 1024);

// All of the ring functions throw c10::Error, before using any data, when the previous rank in the ring called a
// different collective or one of another size, dtype or reduce op.

// Blocks until `output` holds the reduction of every rank's chunk `rank` of `input`. Each rank
// sends and receives (size-1)/size of `input`, as a native reduce-scatter would; all-reduce
// followed by slicing would move twice that.
void run_ring_reduce_scatter(const Ring& ring, at::Tensor output, at::Tensor input);

// Blocks until `output` (size x input, contiguous) holds every rank's `input`, in rank order.
// Each rank sends and receives (size-1)/size of `output`, straight between the tensors: no
// scratch copy.
void run_ring_all_gather(const Ring& ring, at::Tensor output, at::Tensor input);

// As above, with `input` (or `output`) as pieces: chunk q of the reduce-scatter's input is read
// from input.chunks[q] (cast to output's dtype). The all-gather sends `input` if it is given,
// else this rank's own chunk, output.chunks[rank], which the caller has filled; rank q's arrives
// in output.chunks[q] (the wire carries `wire`'s dtype; pieces of another are cast).
void run_ring_reduce_scatter(const Ring& ring, at::Tensor output, const ChunkedTensor& input);
void run_ring_all_gather(const Ring& ring, const ChunkedTensor& output, at::Tensor input);
void run_ring_all_gather_in_place(const Ring& ring, const ChunkedTensor& output, const at::TensorOptions& wire);

// Copies between pieces and a flat buffer, gathered and then issued together by run(): one
// at::_foreach_copy_ (and one _foreach_zero_ for padding) per pair of dtypes, which on CUDA is
// one multi-tensor kernel for the lot where a loop launches a copy per piece (as FSDP2's copy-in
// and split-with-sizes copy-out; a unit over NCCL has a piece per parameter and rank). On the CPU
// ATen runs the same copies one by one.
class PieceCopies {
 public:
  void copy(at::Tensor destination, at::Tensor source);
  void zero(at::Tensor destination);
  void run();  // issues what was gathered, and forgets it

 private:
  std::vector<at::Tensor> destinations_, sources_, zeros_;
};

// The whole tensor's elements from pieces (padding zero), and back; into `copies` to be run
// with others, or at once.
void pack_chunk(const std::vector<ChunkPiece>& pieces, const at::Tensor& into, PieceCopies& copies);
void unpack_chunk(const at::Tensor& from, const std::vector<ChunkPiece>& pieces, PieceCopies& copies);
void pack_chunk(const std::vector<ChunkPiece>& pieces, const at::Tensor& into);
void unpack_chunk(const at::Tensor& from, const std::vector<ChunkPiece>& pieces);

}  // namespace cpprun::detail
