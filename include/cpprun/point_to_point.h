// Point-to-point messages between two ranks of a group, as torch.distributed's send/recv.
//
//   if (group.rank() == 0) cpprun::send(group, t, /*dst=*/1, /*tag=*/7);
//   else if (group.rank() == 1) cpprun::recv(group, t, /*src=*/0, /*tag=*/7);
//
// A message pairs with the receive of the same tag from its sender, in the order both were
// posted. Each carries a small header: a receive whose tensor has another dtype or element count
// than the message fails on both ranks with one message, instead of Gloo's silent half-written
// tensor or abort. Tags are 0 .. kMaxTag.
//
// batch_isend_irecv posts several at once, as torch.distributed.batch_isend_irecv: on NCCL one
// group, so that two ranks that each send to the other before receiving cannot deadlock.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "cpprun/collectives.h"
#include "cpprun/process_group.h"

namespace cpprun {

constexpr int kMaxTag = (1 << 27) - 1;
constexpr int kAnySource = -1;  // recv from whichever rank sends first

// Every rank here (dst, src, the sender's rank a receive returns) is a rank of `group`: PyTorch's
// group_dst / group_src, not its dst / src, which are world ranks. On the default group they agree.

// Completes when `dst` has received the message (its receive acknowledges it).
Work isend(const ProcessGroup& group, at::Tensor tensor, int dst, int tag = 0);
void send(const ProcessGroup& group, const at::Tensor& tensor, int dst, int tag = 0);

// Receives into `tensor` (contiguous, of the sender's dtype and element count). With
// src = kAnySource, the first rank to send with this tag; `source`, when given, is set to the
// sender's rank before the work completes.
Work irecv(const ProcessGroup& group, at::Tensor tensor, int src = kAnySource, int tag = 0,
           int* source = nullptr);
// Returns the sender's rank.
int recv(const ProcessGroup& group, at::Tensor tensor, int src = kAnySource, int tag = 0);

// One send or receive of a batch (torch.distributed.P2POp; the group is the batch's).
struct P2POp {
  enum class Op { kIsend, kIrecv };
  Op op = Op::kIsend;
  at::Tensor tensor;
  int peer = 0;  // dst of an isend, src of an irecv: a rank of the group (never kAnySource)
  int tag = 0;
};

// Posts every op at once and returns one Work per op, in list order. The tensors are all on the
// CPU or all on one GPU. Between two ranks, batched messages pair in the order each lists them
// (as NCCL pairs them, whatever the tags), and only with batched messages: a batch's receive
// whose message was sent otherwise, or in another order, fails on both ranks. On NCCL the first
// batch of a group is collective: every rank of the group makes one.
std::vector<Work> batch_isend_irecv(const ProcessGroup& group, std::vector<P2POp> ops);

}  // namespace cpprun
