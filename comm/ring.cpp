// Ring reduce-scatter over c10d send/recv. See ring.h.
#include "comm/ring.h"

#include <ATen/ATen.h>

namespace cpprun::detail {
namespace {

int message_tag(const RingReduceScatter& ring, int step) {
  // Unique per (op, step) so concurrent ring ops never take each other's messages; Gloo matches
  // point-to-point messages by peer and tag.
  const uint64_t tag = static_cast<uint64_t>(ring.op_index) * ring.size + step;
  return static_cast<int>(tag % (1u << 30));
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
void run_ring_reduce_scatter(const RingReduceScatter& ring, at::Tensor output, at::Tensor input) {
  const int n = ring.size;
  const int64_t m = output.numel();
  at::Tensor chunks = input.reshape({n, m});
  at::Tensor out_flat = output.view({m});
  if (n == 1) {
    out_flat.copy_(chunks[0]);
    return;
  }
  const int next = (ring.rank + 1) % n;
  const int prev = (ring.rank + n - 1) % n;
  auto chunk_index = [&](int offset) { return ((ring.rank - offset) % n + n) % n; };

  at::Tensor sending = chunks[chunk_index(1)].clone();
  at::Tensor receiving = at::empty_like(sending);
  for (int step = 0; step < n - 1; ++step) {
    std::vector<at::Tensor> send_list{sending};
    std::vector<at::Tensor> recv_list{receiving};
    const int tag = message_tag(ring, step);
    auto recv = ring.group->recv(recv_list, prev, tag);
    auto send = ring.group->send(send_list, next, tag);
    recv->wait(ring.timeout);
    send->wait(ring.timeout);
    if (ring.bytes_sent) *ring.bytes_sent += sending.nbytes();
    accumulate(receiving, chunks[chunk_index(step + 2)], ring.op);
    std::swap(sending, receiving);  // the partial just completed travels on at the next step
  }
  if (ring.op == ReduceOp::kAvg) sending.div_(n);
  out_flat.copy_(sending);
}

}  // namespace cpprun::detail
