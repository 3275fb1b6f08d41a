// What every collective of comm/ shares: argument checks, the conversions that let Gloo carry
// what it does not support, and issue_collective(), the one place collectives are issued from.
// Internal to comm/.
#pragma once

#include <ATen/core/Tensor.h>

#include <mutex>

#include "comm/collective_fingerprint.h"
#include "comm/consistency_check.h"
#include "comm/flight_recorder.h"
#include "comm/group_impl.h"
#include "comm/group_membership.h"
#include "comm/work_state.h"
#include "cpprun/collectives.h"

namespace cpprun::detail {

void check_tensor(const char* op, const char* name, const at::Tensor& t);
// A result tensor as the collectives write it: an alias of its memory without autograd's
// bookkeeping (t.detach()). c10d writes all_reduce's and broadcast's results in place whatever
// requires_grad says, in both frameworks; the copies and arithmetic cpprun adds around Gloo (the
// ring, kAvg's division, an uneven gather's copy-out) went through autograd's in-place check and
// threw half-way, on the ranks whose tensor required grad only, the others left waiting. As with
// c10d's own writes, a backward that saved the tensor is not told of every write (those made by
// ATen ops bump the version counter the alias shares; Gloo's own writes do not).
at::Tensor written_in_place(const at::Tensor& t);
void check_same_kind(const char* op, const at::Tensor& output, const at::Tensor& input);
// A reduction's dtype and op: kAvg of a floating or complex tensor; kMax / kMin of an ordered one
// (not complex, as PyTorch refuses); any dtype Note [Reductions Gloo cannot do] can carry.
void check_reduction(const char* op, const at::Tensor& t, ReduceOp reduce);
// `rank` (a root, a peer) is a rank of `group`; `what` names it in the message ("root", "dst").
void check_rank(const char* op, const char* what, int rank, const ProcessGroup& group);

// check_member, then whether the group is a world of one (no communication needed).
bool alone(const char* op, const ProcessGroup& group);

// Note [Reductions Gloo cannot do]
// Gloo (LibTorch 2.15) reduces int8, uint8, int32, int64 and the floats; PyTorch refuses the rest
// ("Invalid scalar type"). cpprun carries them as a type Gloo reduces, exactly: int16 and bool as
// int32 (a bool's sum / max is any true, its min all true), uint16 and uint32 as int64 (cast back
// keeping the low bits, as a sum in the type itself wraps), uint64 as its bits in an int64 (a sum
// wraps alike; max / min with the top bit flipped, so that signed order is unsigned order),
// complex as its real view (sum, avg), the other floats (float8) as float32. They once all went
// through float32, which rounded uint32 and uint64 beyond 2^24 and dropped complex imaginary parts
// with exit 0.
struct ReductionWire {
  at::Tensor wire;            // what Gloo reduces
  bool aliases = false;       // a view of the tensor itself: reduced in place
  bool top_bit_flipped = false;
};
ReductionWire gloo_reduction_wire(const at::Tensor& t, ReduceOp reduce);
// The reduced wire's values into `t` (nothing to do when the wire aliases it and nothing was flipped).
void write_back(const at::Tensor& t, const ReductionWire& wire);
// Operations that only move bits can carry any type as a same-width type Gloo knows.
at::Tensor as_movable_bits(const at::Tensor& t);
c10d::ReduceOp to_c10d(ReduceOp op);

// Whether `call` is checked across ranks before it runs: every collective under DETAIL; by
// default (CPPRUN_CHECK_COLLECTIVES=0 turns it off), the Gloo collectives whose mismatches Gloo
// itself would turn into a silent wrong result or an abort (all_reduce, broadcast, gather,
// scatter, reduce). See checked_across_ranks in collectives.cpp.
bool checked_across_ranks(const detail::GroupImpl& impl, const CollectiveCall& call);

// Every collective is issued through here: it takes the group's next sequence number, makes
// the cross-rank check when one is due, then runs `issue(sequence)`, all under the group's
// issue lock so that checks and collectives keep one order on every rank.
// See Note [Collective consistency check].
// Each call is recorded in the flight recorder (Note [Flight recorder]); a check or an issue that
// throws marks it failed (and dumps) before the error leaves.
template <typename Issue>
Work issue_collective(const ProcessGroup& group, const CollectiveCall& call, Issue issue) {
  auto& impl = detail::impl_of(group);
  std::lock_guard<std::mutex> lock(impl.issue_mutex);
  const uint64_t sequence = ++impl.collectives_issued;
  const uint64_t record =
      record_issued(impl.recorded, sequence, to_string(call.kind), call.tensors, call.reduce, call.root);
  try {
    if (checked_across_ranks(impl, call)) check_across_ranks(impl, call, sequence);
    Work work = issue(sequence);
    attach_record(work, record, impl.timeout);
    return work;
  } catch (...) {
    record_failed(record, impl.timeout, std::current_exception());
    throw;
  }
}

}  // namespace cpprun::detail
