// What one rank is about to do in a collective (op, sequence number, dtype, shapes, root, reduce
// op), packed into a small fixed-size tensor that ranks can exchange and compare, and the
// message that names every rank's call when they differ. Used by the DETAIL-mode check
// (comm/consistency_check.h) and by the ring's neighbour check (comm/ring.cpp).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "comm/public_call.h"
#include "cpprun/collectives.h"

namespace cpprun::detail {

enum class CollectiveKind : int64_t {
  kAllReduce = 1,
  kBroadcast,
  kAllGatherInto,
  kReduceScatter,
  kBarrier,
  kAllToAll,
  kGather,
  kScatter,
  kReduce,
  kSendRecv,   // a point-to-point message: both ends describe it alike (comm/point_to_point.cpp)
};
const char* to_string(CollectiveKind kind);

// One collective call as this rank makes it. Tensors: the output first where there are two.
struct CollectiveCall {
  CollectiveKind kind = CollectiveKind::kBarrier;
  std::vector<at::Tensor> tensors;   // at most two
  std::optional<int> root;           // broadcast; a batched send/recv's place in its order
                                     // (Note [Batched messages] in comm/batch_point_to_point.cpp)
  std::optional<ReduceOp> reduce;    // all_reduce, reduce_scatter, reduce
  // The tensors' shapes may differ between ranks (uneven all-to-all): only their dtype and
  // device are compared.
  bool shapes_vary = false;
  // The public call the collective runs for (Note [The public call of a collective] in
  // comm/public_call.h): named in messages, never compared.
  const char* public_call = PublicCallScope::current();
};

// How strictly two calls must agree.
// Neither compares the public call each rank makes the collective for.
enum class Agreement {
  kExact,        // same op, sequence number, dtype, device, shapes, root, reduce op (DETAIL)
  kSameNumel,    // as kExact, but shapes need only hold as many elements (what a ring moves)
};

// A call packed as kFingerprintLength int64 values: a CPU tensor, so that any backend's ranks
// can exchange it over Gloo. The last six hold the public call's name (its first 48 bytes).
constexpr int64_t kFingerprintLength = 30;
at::Tensor fingerprint(const CollectiveCall& call, uint64_t sequence);

// Whether every row of `fingerprints` (one per rank, kFingerprintLength each) agrees with
// `mine`; if not, the message naming each rank's call, e.g. "cpprun: collective #12 mismatch:
// rank 0 called broadcast(float32[4], root 0), rank 1 called broadcast(float32[8], root 0)."
// `ranks` gives the rank of each row.
std::optional<std::string> mismatch(const at::Tensor& mine, const std::vector<at::Tensor>& fingerprints,
                                    const std::vector<int>& ranks, Agreement agreement);

// "broadcast(float32[4], root 0)": a fingerprint as a call, for messages; made within a public
// call, "broadcast(float32[4], root 0) in cpprun::load_state_dict".
std::string describe(const at::Tensor& fingerprint);
uint64_t sequence_of(const at::Tensor& fingerprint);
std::optional<int64_t> root_of(const at::Tensor& fingerprint);
// The element count of the fingerprint's tensor `index`, and its dtype.
int64_t numel_of(const at::Tensor& fingerprint, int64_t index);
at::ScalarType dtype_of(const at::Tensor& fingerprint);

}  // namespace cpprun::detail
