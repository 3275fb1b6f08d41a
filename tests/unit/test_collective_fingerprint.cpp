// The fingerprints ranks exchange before a collective (comm/collective_fingerprint.h): what
// counts as a mismatch, and the message that names each rank's call.
#include "catch.h"
#include <ATen/ATen.h>

#include "comm/collective_fingerprint.h"

using cpprun::ReduceOp;
using cpprun::detail::Agreement;
using cpprun::detail::CollectiveCall;
using cpprun::detail::CollectiveKind;
using cpprun::detail::fingerprint;
using cpprun::detail::mismatch;

namespace {

at::Tensor broadcast_of(at::Tensor t, int root, uint64_t sequence = 12) {
  return fingerprint(CollectiveCall{CollectiveKind::kBroadcast, {std::move(t)}, root, std::nullopt}, sequence);
}

}  // namespace

TEST_CASE("fingerprint: a call is described as the user wrote it", "[fingerprint]") {
  using cpprun::detail::describe;
  CHECK(describe(broadcast_of(at::zeros({4}), 0)) == "broadcast(float32[4], root 0)");
  CHECK(describe(fingerprint({CollectiveKind::kAllReduce, {at::zeros({2, 3}, at::kBFloat16)}, std::nullopt,
                              ReduceOp::kAvg}, 1)) == "all_reduce(bfloat16[2, 3], avg)");
  CHECK(describe(fingerprint({CollectiveKind::kReduceScatter, {at::zeros({4}), at::zeros({8})}, std::nullopt,
                              ReduceOp::kMax}, 1)) == "reduce_scatter(float32[4], float32[8], max)");
  CHECK(describe(fingerprint({CollectiveKind::kBarrier, {}, std::nullopt, std::nullopt}, 1)) == "barrier()");
  CHECK(describe(broadcast_of(at::zeros({1, 2, 3, 4, 5, 6, 7}), 1)) == "broadcast(float32[1, 2, 3, 4, 5, ...], root 1)");
}

TEST_CASE("fingerprint: identical calls agree, and each difference is a mismatch", "[fingerprint]") {
  const at::Tensor mine = broadcast_of(at::zeros({4}), 0);
  CHECK_FALSE(mismatch(mine, {mine, broadcast_of(at::ones({4}), 0)}, {0, 1}, Agreement::kExact).has_value());
  CHECK(mismatch(mine, {mine, broadcast_of(at::zeros({8}), 0)}, {0, 1}, Agreement::kExact).has_value());
  CHECK(mismatch(mine, {mine, broadcast_of(at::zeros({4}, at::kDouble), 0)}, {0, 1}, Agreement::kExact).has_value());
  CHECK(mismatch(mine, {mine, broadcast_of(at::zeros({4}), 1)}, {0, 1}, Agreement::kExact).has_value());
  CHECK(mismatch(mine, {mine, broadcast_of(at::zeros({4}), 0, 13)}, {0, 1}, Agreement::kExact).has_value());
  CHECK(mismatch(mine, {mine, broadcast_of(at::zeros({2, 2}), 0)}, {0, 1}, Agreement::kExact).has_value());
  // Shapes past the sixth dimension still count.
  CHECK(mismatch(broadcast_of(at::zeros({1, 1, 1, 1, 1, 2, 3}), 0),
                 {broadcast_of(at::zeros({1, 1, 1, 1, 1, 3, 2}), 0)}, {1}, Agreement::kExact).has_value());
  // What a ring compares: the same number of elements is enough.
  CHECK_FALSE(mismatch(mine, {broadcast_of(at::zeros({2, 2}), 0)}, {1}, Agreement::kSameNumel).has_value());
  CHECK(mismatch(mine, {broadcast_of(at::zeros({5}), 0)}, {1}, Agreement::kSameNumel).has_value());
}

TEST_CASE("fingerprint: the message names the collective's number and each rank's call", "[fingerprint]") {
  const at::Tensor four = broadcast_of(at::zeros({4}), 0);
  const at::Tensor eight = broadcast_of(at::zeros({8}), 0);
  CHECK(*mismatch(four, {four, eight}, {0, 1}, Agreement::kExact) ==
        "cpprun: collective #12 mismatch: rank 0 called broadcast(float32[4], root 0), rank 1 called "
        "broadcast(float32[8], root 0). Every rank must call the same collectives in the same order, "
        "with the same dtypes, shapes and roots.");
  // Ranks that agree are named together; rows come in any order.
  CHECK_THAT(*mismatch(eight, {eight, four, four, eight}, {3, 0, 2, 1}, Agreement::kExact),
             Catch::StartsWith("cpprun: collective #12 mismatch: ranks 0, 2 called broadcast(float32[4], "
                               "root 0), ranks 1, 3 called broadcast(float32[8], root 0)."));
  // A rank at another collective number says so.
  CHECK_THAT(*mismatch(four, {four, broadcast_of(at::zeros({4}), 0, 14)}, {0, 1}, Agreement::kExact),
             Catch::Contains("rank 1 called broadcast(float32[4], root 0) as collective #14"));
}

TEST_CASE("fingerprint: the newer collectives, and shapes that may differ between ranks", "[fingerprint]") {
  using cpprun::detail::describe;
  const at::Tensor uneven = fingerprint({CollectiveKind::kAllToAll, {at::zeros({6}), at::zeros({4})}, std::nullopt,
                                         std::nullopt, /*shapes_vary=*/true}, 3);
  CHECK(describe(uneven) == "all_to_all(float32[*], float32[*])");
  const at::Tensor other = fingerprint({CollectiveKind::kAllToAll, {at::zeros({2}), at::zeros({8})}, std::nullopt,
                                        std::nullopt, true}, 3);
  CHECK_FALSE(mismatch(uneven, {uneven, other}, {0, 1}, Agreement::kExact).has_value());
  CHECK(describe(fingerprint({CollectiveKind::kReduce, {at::zeros({3}, at::kDouble)}, 2, ReduceOp::kMax}, 1)) ==
        "reduce(float64[3], root 2, max)");
  const at::Tensor message = fingerprint({CollectiveKind::kSendRecv, {at::zeros({5}, at::kHalf)}, std::nullopt,
                                          std::nullopt}, 9);
  CHECK(describe(message) == "send/recv(float16[5])");
  CHECK(cpprun::detail::numel_of(message, 0) == 5);
  CHECK(cpprun::detail::dtype_of(message) == at::kHalf);
}

TEST_CASE("fingerprint: a call is described with the public call it was made in, never compared by it",
          "[fingerprint]") {
  using cpprun::detail::describe;
  using cpprun::detail::PublicCallScope;
  const at::Tensor outside = broadcast_of(at::zeros({4}), 0);
  CHECK(describe(outside) == "broadcast(float32[4], root 0)");
  at::Tensor saving;
  {
    PublicCallScope call("cpprun::save_state_dict");
    {
      PublicCallScope inner("cpprun::save_optimizer_state_dict");  // the user's call is the outer one
      saving = broadcast_of(at::zeros({4}), 0);
    }
  }
  CHECK(PublicCallScope::current() == nullptr);
  CHECK(describe(saving) == "broadcast(float32[4], root 0) in cpprun::save_state_dict");
  // The same collective reached from two public calls agrees: names are for messages only.
  CHECK_FALSE(mismatch(saving, {saving, outside}, {0, 1}, Agreement::kExact).has_value());
  CHECK_FALSE(mismatch(saving, {outside}, {1}, Agreement::kSameNumel).has_value());
  // A mismatch names each rank's public call.
  at::Tensor training;
  {
    PublicCallScope call("DistributedDataParallel's backward");
    training = fingerprint({CollectiveKind::kAllReduce, {at::zeros({10})}, std::nullopt, ReduceOp::kSum}, 12);
  }
  CHECK_THAT(*mismatch(saving, {saving, training}, {0, 1}, Agreement::kExact),
             Catch::StartsWith("cpprun: collective #12 mismatch: rank 0 called broadcast(float32[4], root 0) in "
                               "cpprun::save_state_dict, rank 1 called all_reduce(float32[10], sum) in "
                               "DistributedDataParallel's backward."));
  // A name longer than the fingerprint holds is cut, and says so.
  {
    PublicCallScope call("FullyShardedDataParallel::gather_full_parameters, and more");
    CHECK(describe(broadcast_of(at::zeros({1}), 0)) ==
          "broadcast(float32[1], root 0) in FullyShardedDataParallel::gather_full_paramet...");
  }
  // A peer's bytes that are no printable name are left out rather than printed.
  at::Tensor garbled = saving.clone();
  garbled[cpprun::detail::kFingerprintLength - 1] = int64_t{0x0102030405060708};
  garbled[cpprun::detail::kFingerprintLength - 6] = int64_t{0x0a0a0a0a0a0a0a0a};
  CHECK(describe(garbled) == "broadcast(float32[4], root 0)");
}
