// Ring reduce-scatter and all-gather over c10d send/recv. See ring.h.
#include "comm/ring.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>

#include "comm/collective_fingerprint.h"

namespace cpprun::detail {
namespace {

// Tags: the high bits number the (op, step) pair, so concurrent ring ops never take each other's
// messages (Gloo matches point-to-point messages by peer and tag); the low bits carry a hash of
// the op's chunk size, so that a peer sending chunks of another size never matches our receive
// (see Note [Ring neighbour check]).
constexpr int kSizeBits = 12;
int message_tag(const Ring& ring, int step, int64_t chunk_bytes) {
  const uint64_t position =
      (static_cast<uint64_t>(ring.op_index) * ring.size + step) % (1u << (30 - kSizeBits));
  const uint64_t size_key = (static_cast<uint64_t>(chunk_bytes) * 0x9E3779B97F4A7C15ull) >> (64 - kSizeBits);
  return static_cast<int>(position << kSizeBits | size_key);
}

// Note [Ring neighbour check]
// Gloo does not compare message sizes: a receive posted for more bytes than its peer sends
// completes with the buffer partly written, and one posted for fewer aborts the process from
// Gloo's I/O thread. So each rank sends its call's fingerprint (192 bytes on every rank) to the
// next rank and compares the previous rank's with its own before it waits for the first data.
// The fingerprint travels beside the first step's data rather than before it (a round trip
// more per op cost ZeRO-3 25% of its step time on a loaded 2-core machine), so the first data
// receive is already posted when the comparison runs: its tag carries the chunk size, so a
// peer's chunks of another size never land in it (but for a 1 in 4096 hash collision, when
// Gloo's own size check applies as before). A mismatch throws on the ranks beside it at once;
// ranks further round the ring, whose neighbours agree, wait for data that does not come and
// fail at the group's timeout.
struct NeighbourCheck {
  at::Tensor theirs;
  c10::intrusive_ptr<C10dWork> recv, send;
};

NeighbourCheck start_neighbour_check(const Ring& ring) {
  NeighbourCheck check;
  if (!ring.call.defined()) return check;
  const int next = (ring.rank + 1) % ring.size;
  const int prev = (ring.rank + ring.size - 1) % ring.size;
  const int tag = message_tag(ring, ring.size - 1, 0);  // step size-1: no data step uses it
  check.theirs = at::empty_like(ring.call);
  std::vector<at::Tensor> send_list{ring.call};
  std::vector<at::Tensor> recv_list{check.theirs};
  check.recv = ring.group->recv(recv_list, prev, tag);
  check.send = ring.group->send(send_list, next, tag);
  return check;
}

void finish_neighbour_check(const Ring& ring, const NeighbourCheck& check) {
  if (!check.recv) return;
  const int prev = (ring.rank + ring.size - 1) % ring.size;
  try {
    check.recv->wait(ring.timeout);
    check.send->wait(ring.timeout);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "cpprun: collective #", sequence_of(ring.call), " ", describe(ring.call),
                " on rank ", ring.rank, ": rank ", prev, " (the previous rank in the ring) sent "
                "nothing for it within ", ring.timeout.count(), " ms. It may have stopped, or be "
                "in a different collective: TORCH_DISTRIBUTED_DEBUG=DETAIL names every rank's "
                "call.\nc10d said: ", e.what());
  }
  if (auto message = mismatch(ring.call, {ring.call, check.theirs}, {ring.rank, prev}, Agreement::kSameNumel)) {
    TORCH_CHECK(false, *message, " (found on rank ", ring.rank, " by comparing its call with rank ",
                prev, "'s before the ring used any data.)");
  }
}

void accumulate(at::Tensor& acc, const at::Tensor& contribution, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: acc.add_(contribution); break;
    case ReduceOp::kMax: at::maximum_out(acc, acc, contribution); break;
    case ReduceOp::kMin: at::minimum_out(acc, acc, contribution); break;
  }
}

// Adds (or maxes, mins) a chunk's pieces into `acc`, laid out as the chunk; padding adds nothing.
void accumulate_chunk(at::Tensor& acc, const std::vector<ChunkPiece>& pieces, ReduceOp op) {
  for (const ChunkPiece& piece : pieces) {
    at::Tensor place = acc.narrow(0, piece.offset, piece.values.numel());
    accumulate(place, piece.values.view({-1}), op);
  }
}

// The chunk itself, when one piece of `dtype` is all of it: the ring then sends from it or
// receives into it directly, with no copy.
at::Tensor whole_chunk(const std::vector<ChunkPiece>& pieces, at::ScalarType dtype, int64_t chunk_numel) {
  if (pieces.size() != 1) return at::Tensor();
  const at::Tensor& values = pieces[0].values;
  if (pieces[0].offset != 0 || values.numel() != chunk_numel || values.scalar_type() != dtype) return at::Tensor();
  return values.view({chunk_numel});
}

// Staging for chunks that are not one tensor: two buffers per ring thread, kept from one op to
// the next (the largest chunk yet, per dtype and device). Fresh CPU memory costs a page fault per
// 4 KiB on first touch, which for FSDP's chunks cost more than their copies (measured).
at::Tensor staging_buffer(int slot, int64_t numel, const at::TensorOptions& options) {
  thread_local at::Tensor kept[2];
  at::Tensor& buffer = kept[slot];
  if (!buffer.defined() || buffer.numel() < numel || buffer.dtype() != options.dtype() ||
      buffer.device() != options.device()) {
    buffer = at::Tensor();  // the old one goes first
    buffer = at::empty({numel}, options);
  }
  return buffer.narrow(0, 0, numel);
}

// One chunk per rank, each the whole of a row of `flat`.
ChunkedTensor rows_of(const at::Tensor& flat, int size) {
  ChunkedTensor chunked;
  chunked.chunk_numel = flat.numel() / size;
  at::Tensor rows = flat.view({size, chunked.chunk_numel});
  for (int q = 0; q < size; ++q) chunked.chunks.push_back({ChunkPiece{0, rows[q]}});
  return chunked;
}

}  // namespace

void pack_chunk(const std::vector<ChunkPiece>& pieces, const at::Tensor& into) {
  std::vector<const ChunkPiece*> sorted;
  for (const ChunkPiece& piece : pieces) sorted.push_back(&piece);
  std::sort(sorted.begin(), sorted.end(), [](const ChunkPiece* a, const ChunkPiece* b) { return a->offset < b->offset; });
  int64_t filled = 0;  // zero only the gaps: most chunks have none
  for (const ChunkPiece* piece : sorted) {
    if (piece->offset > filled) into.narrow(0, filled, piece->offset - filled).zero_();
    const int64_t numel = piece->values.numel();
    at::Tensor place = into.narrow(0, piece->offset, numel);
    if (place.data_ptr() != piece->values.data_ptr()) place.copy_(piece->values.view({-1}));
    filled = piece->offset + numel;
  }
  if (filled < into.numel()) into.narrow(0, filled, into.numel() - filled).zero_();
}

void unpack_chunk(const at::Tensor& from, const std::vector<ChunkPiece>& pieces) {
  for (const ChunkPiece& piece : pieces) {
    at::Tensor source = from.narrow(0, piece.offset, piece.values.numel());
    // view(): a piece must be contiguous, so that what is written lands in the caller's tensor.
    if (source.data_ptr() != piece.values.data_ptr()) piece.values.view({-1}).copy_(source);
  }
}

// Note [Ring reduce-scatter schedule]
// Split the input into `size` chunks. At step s (0 .. size-2) rank r sends its running partial
// of chunk (r-s-1) mod size to rank r+1, and receives rank r-1's partial of chunk (r-s-2) mod
// size, to which it adds its own copy of that chunk. A partial gains one contribution per hop,
// so after size-1 steps rank r holds chunk (r-size) mod size = r, reduced over all ranks.
void run_ring_reduce_scatter(const Ring& ring, at::Tensor output, at::Tensor input) {
  run_ring_reduce_scatter(ring, std::move(output), rows_of(input.reshape({-1}), ring.size));
}

void run_ring_reduce_scatter(const Ring& ring, at::Tensor output, const ChunkedTensor& input) {
  const int n = ring.size;
  const int64_t m = input.chunk_numel;
  TORCH_INTERNAL_ASSERT(output.numel() == m && static_cast<int>(input.chunks.size()) == n);
  at::Tensor out_flat = output.view({m});
  if (n == 1) {
    pack_chunk(input.chunks[0], out_flat);
    return;
  }
  NeighbourCheck check = start_neighbour_check(ring);
  const int next = (ring.rank + 1) % n;
  const int prev = (ring.rank + n - 1) % n;
  auto chunk = [&](int offset) -> const std::vector<ChunkPiece>& { return input.chunks[((ring.rank - offset) % n + n) % n]; };

  // No copies beyond the reduction itself where a chunk is one tensor: the first step sends
  // straight from it, and the last receives straight into the output, where this rank's own
  // chunk is then added. A chunk in pieces is packed once, for the first step.
  at::Tensor sending = whole_chunk(chunk(1), output.scalar_type(), m);
  bool sending_from_input = sending.defined();
  if (!sending_from_input) {
    sending = staging_buffer(0, m, output.options());
    pack_chunk(chunk(1), sending);
  }
  at::Tensor spare;
  // An output inside the input (in place, as NCCL allows) must not be written before the end.
  bool in_place = false;
  for (const auto& pieces : input.chunks) {
    for (const ChunkPiece& piece : pieces) in_place = in_place || output.is_alias_of(piece.values);
  }
  at::Tensor result = in_place ? at::empty_like(out_flat) : out_flat;
  const int64_t chunk_bytes = m * static_cast<int64_t>(output.element_size());
  for (int step = 0; step < n - 1; ++step) {
    const bool last = step == n - 2;
    if (!last && !spare.defined()) {
      const bool first_in_use = !sending_from_input && sending.data_ptr() == staging_buffer(0, m, output.options()).data_ptr();
      spare = staging_buffer(first_in_use ? 1 : 0, m, output.options());
    }
    at::Tensor receiving = last ? result : spare;
    std::vector<at::Tensor> send_list{sending};
    std::vector<at::Tensor> recv_list{receiving};
    const int tag = message_tag(ring, step, chunk_bytes);
    auto recv = ring.group->recv(recv_list, prev, tag);
    auto send = ring.group->send(send_list, next, tag);
    if (step == 0) finish_neighbour_check(ring, check);
    recv->wait(ring.timeout);
    send->wait(ring.timeout);
    if (ring.bytes_sent) *ring.bytes_sent += sending.nbytes();
    accumulate_chunk(receiving, chunk(step + 2), ring.op);
    if (!last) {
      // The partial just completed travels on at the next step; the buffer it was sent from
      // (once it is not the input) receives the next one.
      at::Tensor sent = sending;
      sending = receiving;
      spare = sending_from_input ? at::Tensor() : sent;
      sending_from_input = false;
    }
  }
  if (ring.op == ReduceOp::kAvg) result.div_(n);
  if (in_place) out_flat.copy_(result);
}

// Note [Ring all-gather schedule]
// Rank r's own input goes to chunk r of the output. At step s (0 .. size-2) rank r sends chunk
// (r-s) mod size, which it has by then, to rank r+1, and receives chunk (r-s-1) mod size from
// rank r-1: straight into its place when that is one tensor, else into one of two staging
// buffers, copied out into its pieces while the next step's transfer runs (the buffer is then
// only read, by that transfer's send and by the copy).
void run_ring_all_gather(const Ring& ring, at::Tensor output, at::Tensor input) {
  run_ring_all_gather(ring, rows_of(output.view({-1}), ring.size), std::move(input));
}

void run_ring_all_gather(const Ring& ring, const ChunkedTensor& output, at::Tensor input) {
  const int n = ring.size;
  const int64_t m = input.numel();
  TORCH_INTERNAL_ASSERT(output.chunk_numel == m && static_cast<int>(output.chunks.size()) == n);
  at::Tensor in_flat = input.reshape({m});
  auto chunk = [&](int offset) -> const std::vector<ChunkPiece>& { return output.chunks[((ring.rank - offset) % n + n) % n]; };
  if (n == 1) {
    unpack_chunk(in_flat, chunk(0));
    return;
  }
  NeighbourCheck check = start_neighbour_check(ring);
  const int next = (ring.rank + 1) % n;
  const int prev = (ring.rank + n - 1) % n;
  const int64_t chunk_bytes = m * static_cast<int64_t>(input.element_size());
  at::Tensor staging[2];
  at::Tensor sending = in_flat;
  // What waits to be copied out: this rank's own input first, while step 0 runs.
  const std::vector<ChunkPiece>* unpack_into = &chunk(0);
  at::Tensor unpack_from = in_flat;
  for (int step = 0; step < n - 1; ++step) {
    const std::vector<ChunkPiece>& target = chunk(step + 1);
    at::Tensor receiving = whole_chunk(target, input.scalar_type(), m);
    const bool staged = !receiving.defined();
    if (staged) {
      at::Tensor& buffer = staging[step % 2];
      if (!buffer.defined()) buffer = staging_buffer(step % 2, m, input.options());
      receiving = buffer;
    }
    std::vector<at::Tensor> send_list{sending};
    std::vector<at::Tensor> recv_list{receiving};
    const int tag = message_tag(ring, step, chunk_bytes);
    auto recv = ring.group->recv(recv_list, prev, tag);
    auto send = ring.group->send(send_list, next, tag);
    if (step == 0) finish_neighbour_check(ring, check);
    if (unpack_into) {
      unpack_chunk(unpack_from, *unpack_into);
      unpack_into = nullptr;
    }
    recv->wait(ring.timeout);
    send->wait(ring.timeout);
    if (ring.bytes_sent) *ring.bytes_sent += sending.nbytes();
    if (staged) {
      unpack_into = &target;
      unpack_from = receiving;
    }
    sending = receiving;
  }
  if (unpack_into) unpack_chunk(unpack_from, *unpack_into);
}

}  // namespace cpprun::detail
