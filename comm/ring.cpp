// Ring reduce-scatter and all-gather over c10d send/recv. See ring.h.
#include "comm/ring.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

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

}  // namespace

// Note [Ring reduce-scatter schedule]
// Split the input into `size` chunks. At step s (0 .. size-2) rank r sends its running partial
// of chunk (r-s-1) mod size to rank r+1, and receives rank r-1's partial of chunk (r-s-2) mod
// size, to which it adds its own copy of that chunk. A partial gains one contribution per hop,
// so after size-1 steps rank r holds chunk (r-size) mod size = r, reduced over all ranks.
void run_ring_reduce_scatter(const Ring& ring, at::Tensor output, at::Tensor input) {
  const int n = ring.size;
  const int64_t m = output.numel();
  at::Tensor chunks = input.reshape({n, m});
  at::Tensor out_flat = output.view({m});
  if (n == 1) {
    out_flat.copy_(chunks[0]);
    return;
  }
  NeighbourCheck check = start_neighbour_check(ring);
  const int next = (ring.rank + 1) % n;
  const int prev = (ring.rank + n - 1) % n;
  auto chunk_index = [&](int offset) { return ((ring.rank - offset) % n + n) % n; };

  // No copies beyond the reduction itself: the first step sends straight from the input (a row
  // of it is contiguous), and the last receives straight into the output, where this rank's own
  // chunk is then added.
  at::Tensor sending = chunks[chunk_index(1)];
  at::Tensor spare;
  // An output inside the input (in place, as NCCL allows) must not be written before the end.
  const bool in_place = output.is_alias_of(input);
  at::Tensor result = in_place ? at::empty_like(out_flat) : out_flat;
  for (int step = 0; step < n - 1; ++step) {
    const bool last = step == n - 2;
    if (!last && !spare.defined()) spare = at::empty_like(sending);
    at::Tensor receiving = last ? result : spare;
    std::vector<at::Tensor> send_list{sending};
    std::vector<at::Tensor> recv_list{receiving};
    const int tag = message_tag(ring, step, static_cast<int64_t>(receiving.nbytes()));
    auto recv = ring.group->recv(recv_list, prev, tag);
    auto send = ring.group->send(send_list, next, tag);
    if (step == 0) finish_neighbour_check(ring, check);
    recv->wait(ring.timeout);
    send->wait(ring.timeout);
    if (ring.bytes_sent) *ring.bytes_sent += sending.nbytes();
    accumulate(receiving, chunks[chunk_index(step + 2)], ring.op);
    if (!last) {
      // The partial just completed travels on at the next step; the buffer it was sent from
      // (once it is not the input) receives the next one.
      at::Tensor sent = sending;
      sending = receiving;
      spare = sent.is_alias_of(input) ? at::empty_like(sending) : sent;
    }
  }
  if (ring.op == ReduceOp::kAvg) result.div_(n);
  if (in_place) out_flat.copy_(result);
}

// Note [Ring all-gather schedule]
// Rank r first puts its input in row r of the output. At step s (0 .. size-2) it sends row
// (r-s) mod size, which it has by then, to rank r+1, and receives row (r-s-1) mod size from rank
// r-1 straight into its place.
void run_ring_all_gather(const Ring& ring, at::Tensor output, at::Tensor input) {
  const int n = ring.size;
  const int64_t m = input.numel();
  at::Tensor rows = output.view({n, m});
  at::Tensor own = rows[ring.rank];
  if (own.data_ptr() != input.data_ptr()) own.copy_(input.reshape({m}));  // unless gathering in place
  NeighbourCheck check = start_neighbour_check(ring);
  const int next = (ring.rank + 1) % n;
  const int prev = (ring.rank + n - 1) % n;
  auto row = [&](int offset) { return rows[((ring.rank - offset) % n + n) % n]; };
  for (int step = 0; step < n - 1; ++step) {
    std::vector<at::Tensor> send_list{row(step)};
    std::vector<at::Tensor> recv_list{row(step + 1)};
    const int tag = message_tag(ring, step, static_cast<int64_t>(recv_list[0].nbytes()));
    auto recv = ring.group->recv(recv_list, prev, tag);
    auto send = ring.group->send(send_list, next, tag);
    if (step == 0) finish_neighbour_check(ring, check);
    recv->wait(ring.timeout);
    send->wait(ring.timeout);
    if (ring.bytes_sent) *ring.bytes_sent += send_list[0].nbytes();
  }
}

}  // namespace cpprun::detail
