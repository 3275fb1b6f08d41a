// Ring reduce-scatter and all-gather over c10d send/recv. See ring.h.
#include "comm/ring.h"


#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "comm/collective_fingerprint.h"
#include "comm/peer_loss.h"

namespace cpprun::detail {
namespace {

// Tags: the high bits number the (op, step) pair, so concurrent ring ops never take each other's
// messages (Gloo matches point-to-point messages by peer and tag); the low bits carry a hash of
// the message's index within the step and its size, so that the messages of one step stay apart
// and a peer sending chunks of another size never matches our receive (see Note [Ring neighbour
// check]).
constexpr int kSizeBits = 12;
int message_tag(const Ring& ring, int step, int message, int64_t message_bytes) {
  const uint64_t position =
      (static_cast<uint64_t>(ring.op_index) * ring.size + step) % (1u << (30 - kSizeBits));
  const uint64_t key = static_cast<uint64_t>(message_bytes) ^ (static_cast<uint64_t>(message) << 44);
  const uint64_t size_key = (key * 0x9E3779B97F4A7C15ull) >> (64 - kSizeBits);
  return static_cast<int>(position << kSizeBits | size_key);
}

// Note [Ring neighbour check]
// Gloo does not compare message sizes: a receive posted for more bytes than its peer sends
// completes with the buffer partly written, and one posted for fewer aborts the process from
// Gloo's I/O thread. So each rank sends its call's fingerprint (240 bytes on every rank) to the
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
  const int tag = message_tag(ring, ring.size - 1, 0, 0);  // step size-1: no data step uses it
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
    const std::string said = c10d_text(e);
    if (peer_connection_lost(said)) {
      TORCH_CHECK(false, "cpprun: collective #", sequence_of(ring.call), " ", describe(ring.call), " on rank ",
                  ring.rank, ": a rank's process ended before reaching it (rank ", prev, ", the previous rank in "
                  "the ring, or another: its connection closed). Its own output and cpprun's diagnosis say "
                  "which.\nc10d said: ", said);
    }
    TORCH_CHECK(false, "cpprun: collective #", sequence_of(ring.call), " ", describe(ring.call),
                " on rank ", ring.rank, ": rank ", prev, " (the previous rank in the ring) sent "
                "nothing for it within ", ring.timeout.count(), " ms. It may have stopped, or be "
                "in a different collective: TORCH_DISTRIBUTED_DEBUG=DETAIL names every rank's "
                "call.\nc10d said: ", said);
  }
  if (auto message = mismatch(ring.call, {ring.call, check.theirs}, {ring.rank, prev}, Agreement::kSameNumel)) {
    TORCH_CHECK(false, *message, " (found on rank ", ring.rank, " by comparing its call with rank ",
                prev, "'s before the ring used any data.)");
  }
}

// A contribution of another dtype than the wire's (FSDP's gradients reduced in its reduce_dtype)
// is rounded to the wire's first, as every rank's input to a collective in that dtype is: added
// unrounded, a wider one (float64 gradients reduced in float32) would be summed in its own dtype
// and rounded once, other bits than FSDP2's, which casts its input before the collective.
void accumulate(at::Tensor& acc, const at::Tensor& contribution_as_given, ReduceOp op) {
  const at::Tensor contribution = contribution_as_given.scalar_type() == acc.scalar_type()
                                      ? contribution_as_given
                                      : contribution_as_given.to(acc.scalar_type());
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: acc.add_(contribution); break;
    case ReduceOp::kMax: at::maximum_out(acc, acc, contribution); break;
    case ReduceOp::kMin: at::minimum_out(acc, acc, contribution); break;
    case ReduceOp::kProduct: acc.mul_(contribution); break;
    case ReduceOp::kBAnd: acc.bitwise_and_(contribution); break;
    case ReduceOp::kBOr: acc.bitwise_or_(contribution); break;
    case ReduceOp::kBXor: acc.bitwise_xor_(contribution); break;
  }
}

// Adds (or maxes, multiplies, ...) pieces into `acc`, laid out as they say; padding adds nothing.
void accumulate_pieces(at::Tensor& acc, const std::vector<ChunkPiece>& pieces, ReduceOp op) {
  for (const ChunkPiece& piece : pieces) {
    at::Tensor place = acc.narrow(0, piece.offset, piece.values.numel());
    accumulate(place, piece.values.view({-1}), op);
  }
}

// Staging for messages that are not one tensor: two buffers per ring thread, kept from one op to
// the next (the largest chunk yet, per dtype and device). Fresh CPU memory costs a page fault per
// 4 KiB on first touch, which for FSDP's chunks cost more than their copies (measured).
thread_local at::Tensor staging_kept[2];

at::Tensor staging_buffer(int slot, int64_t numel, const at::TensorOptions& options) {
  at::Tensor& buffer = staging_kept[slot];
  if (!buffer.defined() || buffer.numel() < numel || buffer.dtype() != options.dtype() ||
      buffer.device() != options.device()) {
    buffer = at::Tensor();  // the old one goes first
    buffer = at::empty({numel}, options);
  }
  return buffer.narrow(0, 0, numel);
}

// One message of a chunk: where it lies, and the pieces inside it (offsets from its start).
// `direct` is the message itself when it is exactly one piece of the wire's dtype: the ring
// then sends from it or receives into it, with no copy.
struct MessagePlace {
  int64_t offset = 0;
  int64_t numel = 0;
  std::vector<ChunkPiece> pieces;
  at::Tensor direct;
};

std::vector<MessagePlace> place_messages(const ChunkedTensor& chunked, const std::vector<ChunkPiece>& pieces,
                                         at::ScalarType dtype) {
  const int64_t m = chunked.chunk_numel;
  std::vector<int64_t> starts = chunked.message_starts;
  if (starts.empty()) starts.push_back(0);
  TORCH_INTERNAL_ASSERT(starts.front() == 0 && std::is_sorted(starts.begin(), starts.end()) && starts.back() <= m,
                        "ring: message starts must ascend from 0 within the chunk");
  std::vector<MessagePlace> places(starts.size());
  for (std::size_t k = 0; k < starts.size(); ++k) {
    places[k].offset = starts[k];
    places[k].numel = (k + 1 < starts.size() ? starts[k + 1] : m) - starts[k];
  }
  for (const ChunkPiece& piece : pieces) {
    if (piece.values.numel() == 0) continue;
    const auto k = static_cast<std::size_t>(std::upper_bound(starts.begin(), starts.end(), piece.offset) - starts.begin() - 1);
    MessagePlace& place = places[k];
    TORCH_INTERNAL_ASSERT(piece.offset + piece.values.numel() <= place.offset + place.numel,
                          "ring: a piece at ", piece.offset, " crosses the end of its message");
    place.pieces.push_back({piece.offset - place.offset, piece.values});
  }
  for (MessagePlace& place : places) {
    if (place.pieces.size() != 1) continue;
    const ChunkPiece& only = place.pieces[0];
    if (only.offset == 0 && only.values.numel() == place.numel && only.values.scalar_type() == dtype) {
      place.direct = only.values.view({place.numel});
    }
  }
  // Messages of no elements are not sent (every rank skips the same ones).
  places.erase(std::remove_if(places.begin(), places.end(), [](const MessagePlace& p) { return p.numel == 0; }),
               places.end());
  return places;
}

// Where each message of `places` is read from or written to: itself when direct, else its place
// in `staging()` (a buffer of the whole chunk, asked for only then, so that a chunk of direct
// messages touches none), packed from its pieces first if `pack`.
template <typename Staging>
std::vector<at::Tensor> message_tensors(const std::vector<MessagePlace>& places, Staging&& staging, bool pack) {
  std::vector<at::Tensor> tensors;
  for (const MessagePlace& place : places) {
    if (place.direct.defined()) {
      tensors.push_back(place.direct);
      continue;
    }
    at::Tensor staged = staging().narrow(0, place.offset, place.numel);
    if (pack) pack_chunk(place.pieces, staged);
    tensors.push_back(staged);
  }
  return tensors;
}

// Posts one step's receives (first, so a peer's data has somewhere to land) and sends.
// Note [CUDA tensors over Gloo's send/recv]: Gloo's TCP transport reads and writes the tensor's
// memory from the host, so a CUDA tensor's device pointer fails there (writev: Bad address, and
// the process aborts). Ranks sharing one GPU over Gloo (NCCL refuses two ranks on one device) get
// their messages staged through host memory: a send goes from a host copy, a receive lands in a
// host buffer that wait_recv copies to the device. Every kernel of the ring, those copies
// included, runs on the stream the caller issued the collective from (Ring::stream, made current
// by the executor thread): a copy to the host waits for that stream only, so it reads what the
// caller wrote before the call, and the caller's work after wait() follows the ring's last copy.
// (It was a device-wide synchronisation before every step: it also waited for other streams'
// unrelated work, and it did not order the ring's last copies before the caller's stream.)
struct StepWork {
  std::vector<c10::intrusive_ptr<C10dWork>> recvs, sends;
  std::vector<at::Tensor> recv_staging, recv_targets;  // per receive: a host buffer and its device tensor, or none
  std::vector<at::Tensor> send_staging;                // host copies kept until the sends finish
};

StepWork post_step(const Ring& ring, int step, const std::vector<at::Tensor>& sending,
                   const std::vector<at::Tensor>& receiving) {
  TORCH_INTERNAL_ASSERT(sending.size() == receiving.size());
  const int next = (ring.rank + 1) % ring.size;
  const int prev = (ring.rank + ring.size - 1) % ring.size;
  StepWork work;
  for (std::size_t k = 0; k < receiving.size(); ++k) {
    at::Tensor target = receiving[k];
    at::Tensor landing = target.is_cuda() ? at::empty(target.sizes(), target.options().device(at::kCPU)) : target;
    work.recv_staging.push_back(target.is_cuda() ? landing : at::Tensor());
    work.recv_targets.push_back(target);
    std::vector<at::Tensor> recv_list{landing};
    const int tag = message_tag(ring, step, static_cast<int>(k), static_cast<int64_t>(receiving[k].nbytes()));
    work.recvs.push_back(ring.group->recv(recv_list, prev, tag));
  }
  for (std::size_t k = 0; k < sending.size(); ++k) {
    at::Tensor outgoing = sending[k].is_cuda() ? sending[k].to(at::kCPU) : sending[k];
    if (sending[k].is_cuda()) work.send_staging.push_back(outgoing);
    std::vector<at::Tensor> send_list{outgoing};
    const int tag = message_tag(ring, step, static_cast<int>(k), static_cast<int64_t>(sending[k].nbytes()));
    work.sends.push_back(ring.group->send(send_list, next, tag));
  }
  return work;
}

// Note [A mismatch with messages posted]
// The neighbour check fails after the first step's messages are posted (Note [Ring neighbour
// check]). Destroyed unfinished, Gloo's pending buffers left the pair broken: when the two calls'
// chunks were of one size (sum against max; float32 against int32), so that the messages paired,
// the group's next collective waited out the timeout in about half the runs (an audit, 2026-12-07).
// So the first step's messages are kept, for as long as the process runs, and complete or never
// come, harmlessly (a mismatch is rare; each keeps one step's buffers). This thread's staging
// buffers go with them: a late message must not land in the next collective's.
void check_neighbour_keeping(const Ring& ring, const NeighbourCheck& check, StepWork& first_step) {
  try {
    finish_neighbour_check(ring, check);
  } catch (...) {
    static std::mutex mutex;
    static auto* kept = new std::vector<StepWork>();  // never destroyed: at exit Gloo may be gone
    {
      std::lock_guard<std::mutex> lock(mutex);
      kept->push_back(std::move(first_step));
    }
    for (at::Tensor& buffer : staging_kept) buffer = at::Tensor();  // the kept works hold them
    throw;
  }
}

// Waits for one message to or from `peer`; what Gloo throws (its own exception types, which
// would otherwise reach the caller raw) becomes our message naming the collective and the peer.
void wait_message(const Ring& ring, const c10::intrusive_ptr<C10dWork>& work, int peer, const char* direction) {
  try {
    work->wait(ring.timeout);
  } catch (const std::exception& e) {
    const std::string op = ring.call.defined()
                               ? "collective #" + std::to_string(sequence_of(ring.call)) + " " + describe(ring.call)
                               : std::string("a ring collective");
    const std::string said = c10d_text(e);
    if (peer_connection_lost(said)) {
      TORCH_CHECK(false, "cpprun: ", op, " on rank ",
                  ring.rank, ": a rank's process ended during it (the connection ", direction, " rank ", peer,
                  " closed). Its own output and cpprun's diagnosis say which.\nc10d said: ", said);
    }
    TORCH_CHECK(false, "cpprun: ", op, " on rank ", ring.rank, ": a message ", direction, " rank ", peer, " did not complete within ",
                ring.timeout.count(), " ms. A rank may have stopped.\nc10d said: ", said);
  }
}

void wait_recv(const Ring& ring, const StepWork& work, std::size_t k) {
  wait_message(ring, work.recvs[k], (ring.rank + ring.size - 1) % ring.size, "from");
  if (work.recv_staging[k].defined()) work.recv_targets[k].copy_(work.recv_staging[k]);  // Note [CUDA tensors over Gloo's send/recv]
}

void finish_sends(const Ring& ring, const StepWork& work, const std::vector<at::Tensor>& sending) {
  for (std::size_t k = 0; k < work.sends.size(); ++k) {
    wait_message(ring, work.sends[k], (ring.rank + 1) % ring.size, "to");
    if (ring.bytes_sent) *ring.bytes_sent += sending[k].nbytes();
  }
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

void PieceCopies::copy(at::Tensor destination, at::Tensor source) {
  if (destination.data_ptr() == source.data_ptr()) return;  // already in place
  destinations_.push_back(std::move(destination));
  sources_.push_back(std::move(source));
}

void PieceCopies::zero(at::Tensor destination) { zeros_.push_back(std::move(destination)); }

void PieceCopies::run() {
  at::NoGradGuard no_grad;
  // _foreach_copy_ takes lists whose tensors share their dtypes (a cast is one pair of dtypes).
  std::map<std::pair<at::ScalarType, at::ScalarType>, std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>>> by_dtypes;
  for (std::size_t i = 0; i < destinations_.size(); ++i) {
    auto& lists = by_dtypes[{destinations_[i].scalar_type(), sources_[i].scalar_type()}];
    lists.first.push_back(destinations_[i]);
    lists.second.push_back(sources_[i]);
  }
  for (auto& [dtypes, lists] : by_dtypes) at::_foreach_copy_(lists.first, lists.second);
  if (!zeros_.empty()) at::_foreach_zero_(zeros_);
  destinations_.clear(), sources_.clear(), zeros_.clear();
}

void pack_chunk(const std::vector<ChunkPiece>& pieces, const at::Tensor& into, PieceCopies& copies) {
  std::vector<const ChunkPiece*> sorted;
  for (const ChunkPiece& piece : pieces) sorted.push_back(&piece);
  std::sort(sorted.begin(), sorted.end(), [](const ChunkPiece* a, const ChunkPiece* b) { return a->offset < b->offset; });
  int64_t filled = 0;  // zero only the gaps: most chunks have none
  for (const ChunkPiece* piece : sorted) {
    if (piece->offset > filled) copies.zero(into.narrow(0, filled, piece->offset - filled));
    const int64_t numel = piece->values.numel();
    copies.copy(into.narrow(0, piece->offset, numel), piece->values.view({-1}));
    filled = piece->offset + numel;
  }
  if (filled < into.numel()) copies.zero(into.narrow(0, filled, into.numel() - filled));
}

void unpack_chunk(const at::Tensor& from, const std::vector<ChunkPiece>& pieces, PieceCopies& copies) {
  for (const ChunkPiece& piece : pieces) {
    // view(): a piece must be contiguous, so that what is written lands in the caller's tensor.
    copies.copy(piece.values.view({-1}), from.narrow(0, piece.offset, piece.values.numel()));
  }
}

void pack_chunk(const std::vector<ChunkPiece>& pieces, const at::Tensor& into) {
  PieceCopies copies;
  pack_chunk(pieces, into, copies);
  copies.run();
}

void unpack_chunk(const at::Tensor& from, const std::vector<ChunkPiece>& pieces) {
  PieceCopies copies;
  unpack_chunk(from, pieces, copies);
  copies.run();
}

// Note [Ring reduce-scatter schedule]
// Split the input into `size` chunks. At step s (0 .. size-2) rank r sends its running partial
// of chunk (r-s-1) mod size to rank r+1, and receives rank r-1's partial of chunk (r-s-2) mod
// size, to which it adds its own copy of that chunk. A partial gains one contribution per hop,
// so after size-1 steps rank r holds chunk (r-size) mod size = r, reduced over all ranks.
// Each chunk moves as its messages (ChunkedTensor::message_starts); a message's own copy is
// added as soon as it arrives, while the step's later messages are still on the wire.
// Where partials wait between steps: in two staging chunks, or, when the input's pieces are
// scratch, in the pieces themselves. A partial then arrives in the output (free until the last
// step), is added into this rank's piece of that chunk, and is sent on from the piece, so no
// chunk-sized buffer is touched beside the input and the output; only messages that are not one
// piece of the wire's dtype (grouped small parameters) still pass through staging.
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
  const at::ScalarType dtype = output.scalar_type();
  auto chunk = [&](int offset) -> const std::vector<ChunkPiece>& { return input.chunks[((ring.rank - offset) % n + n) % n]; };

  // An output inside the input (in place, as NCCL allows) must not be written before the end.
  bool in_place = false;
  for (const auto& pieces : input.chunks) {
    for (const ChunkPiece& piece : pieces) in_place = in_place || output.is_alias_of(piece.values);
  }
  at::Tensor result = in_place ? at::empty_like(out_flat) : out_flat;
  // Partials arrive in staging[(step + 1) % 2] (the last straight into the result) and are sent
  // on from there; the first step sends straight from the input's pieces where a message is one
  // piece, else from staging[0], packed. (Only the messages staged touch a staging buffer's pages.)
  at::Tensor staging[2];
  auto stage = [&](int slot) -> const at::Tensor& {
    if (!staging[slot].defined()) staging[slot] = staging_buffer(slot, m, output.options());
    return staging[slot];
  };
  const std::vector<MessagePlace> first = place_messages(input, chunk(1), dtype);
  std::vector<at::Tensor> sending = message_tensors(first, [&] { return stage(0); }, /*pack=*/true);
  for (int step = 0; step < n - 1; ++step) {
    const bool last = step == n - 2;
    const bool into_pieces = input.pieces_are_scratch && !last;
    const std::vector<MessagePlace> own = place_messages(input, chunk(step + 2), dtype);
    const at::Tensor& into = (last || into_pieces) ? result : stage((step + 1) % 2);
    std::vector<at::Tensor> receiving;
    for (const MessagePlace& place : own) receiving.push_back(into.narrow(0, place.offset, place.numel));
    StepWork work = post_step(ring, step, sending, receiving);
    if (step == 0) check_neighbour_keeping(ring, check, work);
    std::vector<at::Tensor> partials;  // what the next step sends
    for (std::size_t k = 0; k < own.size(); ++k) {
      wait_recv(ring, work, k);
      if (!into_pieces) {
        accumulate_pieces(receiving[k], own[k].pieces, ring.op);
        partials.push_back(receiving[k]);
      } else if (own[k].direct.defined()) {
        at::Tensor piece = own[k].direct;
        accumulate(piece, receiving[k], ring.op);
        partials.push_back(piece);
      } else {
        at::Tensor staged = stage((step + 1) % 2).narrow(0, own[k].offset, own[k].numel);
        staged.copy_(receiving[k]);
        accumulate_pieces(staged, own[k].pieces, ring.op);
        partials.push_back(staged);
      }
    }
    finish_sends(ring, work, sending);
    sending = std::move(partials);
  }
  if (ring.op == ReduceOp::kAvg) result.div_(n);
  if (in_place) out_flat.copy_(result);
}

// Note [Ring all-gather schedule]
// Rank r's own input goes to chunk r of the output. At step s (0 .. size-2) rank r sends chunk
// (r-s) mod size, which it has by then, to rank r+1, and receives chunk (r-s-1) mod size from
// rank r-1: each message straight into its place when that is one piece, else into one of two
// staging buffers, copied out into its pieces while the next step's transfer runs (the buffer is
// then only read, by that transfer's send and by the copy).
namespace {

// A staged message waiting to be copied out into its pieces.
struct Unpack {
  at::Tensor from;
  std::vector<ChunkPiece> pieces;
};

void run_unpacks(std::vector<Unpack>& unpacks) {
  PieceCopies copies;
  for (const Unpack& u : unpacks) unpack_chunk(u.from, u.pieces, copies);
  copies.run();
  unpacks.clear();
}

void ring_all_gather(const Ring& ring, const ChunkedTensor& output, const at::Tensor& input,
                     const at::TensorOptions& wire) {
  const int n = ring.size;
  const int64_t m = output.chunk_numel;
  TORCH_INTERNAL_ASSERT(static_cast<int>(output.chunks.size()) == n);
  const at::ScalarType dtype = c10::typeMetaToScalarType(wire.dtype());
  auto chunk = [&](int offset) -> const std::vector<ChunkPiece>& { return output.chunks[((ring.rank - offset) % n + n) % n]; };
  const at::Tensor in_flat = input.defined() ? input.reshape({m}) : at::Tensor();
  if (n == 1) {
    if (in_flat.defined()) unpack_chunk(in_flat, chunk(0));
    return;
  }
  NeighbourCheck check = start_neighbour_check(ring);
  at::Tensor staging[2];
  auto stage = [&](int slot) -> const at::Tensor& {
    if (!staging[slot].defined()) staging[slot] = staging_buffer(slot, m, wire);
    return staging[slot];
  };
  // Step 0 sends `input`, or this rank's own chunk from its pieces (packed, where a message is
  // not one piece, into staging[1]: step 0 receives into staging[0], and step 1 into staging[1]
  // only after step 0's sends are done).
  std::vector<Unpack> unpacks;  // copied out while the next transfer runs
  std::vector<at::Tensor> sending;
  const std::vector<MessagePlace> own = place_messages(output, chunk(0), dtype);
  if (in_flat.defined()) {
    for (const MessagePlace& place : own) sending.push_back(in_flat.narrow(0, place.offset, place.numel));
    unpacks.push_back({in_flat, chunk(0)});
  } else {
    sending = message_tensors(own, [&] { return stage(1); }, /*pack=*/true);
  }
  for (int step = 0; step < n - 1; ++step) {
    const std::vector<MessagePlace> target = place_messages(output, chunk(step + 1), dtype);
    std::vector<at::Tensor> receiving = message_tensors(target, [&] { return stage(step % 2); }, /*pack=*/false);
    StepWork work = post_step(ring, step, sending, receiving);
    if (step == 0) check_neighbour_keeping(ring, check, work);
    run_unpacks(unpacks);
    for (std::size_t k = 0; k < work.recvs.size(); ++k) wait_recv(ring, work, k);
    finish_sends(ring, work, sending);
    for (std::size_t k = 0; k < target.size(); ++k) {
      if (!target[k].direct.defined()) unpacks.push_back({receiving[k], target[k].pieces});
    }
    sending = std::move(receiving);
  }
  run_unpacks(unpacks);
}

}  // namespace

void run_ring_all_gather(const Ring& ring, at::Tensor output, at::Tensor input) {
  run_ring_all_gather(ring, rows_of(output.view({-1}), ring.size), std::move(input));
}

void run_ring_all_gather(const Ring& ring, const ChunkedTensor& output, at::Tensor input) {
  TORCH_INTERNAL_ASSERT(output.chunk_numel == input.numel());
  ring_all_gather(ring, output, input, input.options());
}

void run_ring_all_gather_in_place(const Ring& ring, const ChunkedTensor& output, const at::TensorOptions& wire) {
  ring_all_gather(ring, output, at::Tensor(), wire);
}

std::vector<int64_t> message_starts_for(const std::vector<std::pair<int64_t, int64_t>>& extents,
                                        int64_t element_size, int64_t min_message_bytes) {
  std::vector<int64_t> starts;
  int64_t grouped_bytes = -1;  // of the message of small extents being filled; -1: none open
  for (const auto& [offset, numel] : extents) {
    if (numel == 0) continue;
    const int64_t bytes = numel * element_size;
    if (bytes >= min_message_bytes) {
      starts.push_back(offset);
      grouped_bytes = -1;
      continue;
    }
    if (grouped_bytes < 0 || grouped_bytes >= min_message_bytes) {
      starts.push_back(offset);
      grouped_bytes = 0;
    }
    grouped_bytes += bytes;
  }
  if (starts.empty()) return starts;
  starts.front() = 0;  // whatever precedes the first extent travels with it
  return starts;
}

}  // namespace cpprun::detail
