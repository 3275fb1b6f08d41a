// Ring reduce-scatter and all-gather over c10d send/recv. See ring.h.
#include "comm/ring.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "comm/collective_fingerprint.h"

namespace cpprun::detail {
namespace {

int message_tag(const Ring& ring, int step) {
  // Unique per (op, step) so concurrent ring ops never take each other's messages; Gloo matches
  // point-to-point messages by peer and tag.
  const uint64_t tag = static_cast<uint64_t>(ring.op_index) * ring.size + step;
  return static_cast<int>(tag % (1u << 30));
}

// The tag of the check's message: step size-1, which no data step uses.
int check_tag(const Ring& ring) { return message_tag(ring, ring.size - 1); }

// Note [Ring neighbour check]
// Gloo does not compare message sizes: a receive posted for more bytes than its peer sends
// completes with the buffer partly written, and one posted for fewer aborts the process from
// Gloo's I/O thread. So before the first data step each rank sends its call's fingerprint (192
// bytes, the same size on every rank) to the next rank and compares the previous rank's with
// its own. A mismatch throws on the ranks beside it at once; ranks further round the ring,
// whose neighbours agree, then wait for data that does not come and fail at the group's
// timeout. The messages travel in parallel with nothing else, so the check costs one small
// message latency per ring collective (README, "Collective consistency": measured).
void check_neighbours(const Ring& ring) {
  if (!ring.call.defined()) return;
  const int next = (ring.rank + 1) % ring.size;
  const int prev = (ring.rank + ring.size - 1) % ring.size;
  at::Tensor theirs = at::empty_like(ring.call);
  std::vector<at::Tensor> send_list{ring.call};
  std::vector<at::Tensor> recv_list{theirs};
  auto recv = ring.group->recv(recv_list, prev, check_tag(ring));
  auto send = ring.group->send(send_list, next, check_tag(ring));
  try {
    recv->wait(ring.timeout);
    send->wait(ring.timeout);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "cpprun: collective #", sequence_of(ring.call), " ", describe(ring.call),
                " on rank ", ring.rank, ": rank ", prev, " (the previous rank in the ring) sent "
                "nothing for it within ", ring.timeout.count(), " ms. It may have stopped, or be "
                "in a different collective: TORCH_DISTRIBUTED_DEBUG=DETAIL names every rank's "
                "call.\nc10d said: ", e.what());
  }
  if (auto message = mismatch(ring.call, {ring.call, theirs}, {ring.rank, prev}, Agreement::kSameNumel)) {
    TORCH_CHECK(false, *message, " (found on rank ", ring.rank, " by comparing its call with rank ",
                prev, "'s before the ring moves any data.)");
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
  check_neighbours(ring);
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
    const int tag = message_tag(ring, step);
    auto recv = ring.group->recv(recv_list, prev, tag);
    auto send = ring.group->send(send_list, next, tag);
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
  check_neighbours(ring);
  const int next = (ring.rank + 1) % n;
  const int prev = (ring.rank + n - 1) % n;
  auto row = [&](int offset) { return rows[((ring.rank - offset) % n + n) % n]; };
  for (int step = 0; step < n - 1; ++step) {
    std::vector<at::Tensor> send_list{row(step)};
    std::vector<at::Tensor> recv_list{row(step + 1)};
    const int tag = message_tag(ring, step);
    auto recv = ring.group->recv(recv_list, prev, tag);
    auto send = ring.group->send(send_list, next, tag);
    recv->wait(ring.timeout);
    send->wait(ring.timeout);
    if (ring.bytes_sent) *ring.bytes_sent += send_list[0].nbytes();
  }
}

}  // namespace cpprun::detail
