// batch_isend_irecv on the real process group (Gloo), under `cpprun --nproc_per_node=K` for
// K = 1..4: the ring where every rank sends before it receives, several messages between one pair
// matched by order and tag, mismatches that fail on both ranks naming both, and input refused
// before anything is sent. float64 wherever values are compared.
// CHECK, not REQUIRE: a failing rank still makes the same calls as the others.
#include "catch.h"
#include <ATen/ATen.h>

#include <numeric>
#include <vector>

#include "comm/labelled_messages.h"  // batch_isend_irecv_labelled, as the pipeline calls it
#include "cpprun/cpprun.h"
#include "cpprun/point_to_point.h"
#include "dist_test_support.h"

using cpprun::P2POp;
using dist_test::group;

namespace {

constexpr auto kIsend = P2POp::Op::kIsend;
constexpr auto kIrecv = P2POp::Op::kIrecv;

// Rank `from`'s message `k` of n values to rank `to`: distinct per (from, to, k, i).
at::Tensor message(int from, int to, int k, int64_t n) {
  return at::arange(n, at::kDouble) + 1e6 * from + 1e4 * to + 100.0 * k;
}

void wait_all(std::vector<cpprun::Work>& works) {
  for (auto& work : works) work.wait();
}

// A group of every rank, new for each case: its batched messages are counted from 0, so the
// messages below can name their places.
cpprun::ProcessGroup fresh_group() {
  std::vector<int> ranks(group().size());
  std::iota(ranks.begin(), ranks.end(), 0);
  return cpprun::new_group(group(), ranks);
}

}  // namespace

TEST_CASE("batch_isend_irecv: a ring, every rank sending to the next before it receives", "[p2p][batch]") {
  const int world = group().size(), rank = group().rank();
  if (world == 1) {
    CHECK_THROWS_WITH(cpprun::batch_isend_irecv(group(), {{kIsend, at::ones({1}, at::kDouble), 0}}),
                      Catch::Contains("op 0 (isend): rank 0 cannot message itself"));
    return;
  }
  const int next = (rank + 1) % world, prev = (rank + world - 1) % world;
  // Every rank lists its send first, 8 MiB each way: the shape that deadlocks on NCCL when the
  // sends are not grouped with the receives (and anywhere when a send waits for its receive
  // before the next op is posted).
  for (int64_t n : {int64_t{1}, int64_t{1} << 20}) {
    at::Tensor received = at::full({n}, -1.0, at::kDouble);
    std::vector<P2POp> ops = {{kIsend, message(rank, next, 0, n), next, 3}, {kIrecv, received, prev, 3}};
    auto works = cpprun::batch_isend_irecv(group(), ops);
    CHECK(works.size() == 2);
    wait_all(works);
    INFO("n " << n);
    CHECK(received.equal(message(prev, rank, 0, n)));
  }
}

TEST_CASE("batch_isend_irecv: each op is in the flight recorder, with its label", "[p2p][batch]") {
  const int world = group().size(), rank = group().rank();
  if (world == 1) return;
  const int next = (rank + 1) % world, prev = (rank + world - 1) % world;
  at::Tensor got = at::zeros({3}, at::kDouble);
  auto works = cpprun::detail::batch_isend_irecv_labelled(
      group(), {{kIsend, message(rank, next, 0, 3), next, 11}, {kIrecv, got, prev, 11}},
      {"ring: to the next rank", "ring: from the previous rank"});
  wait_all(works);
  CHECK(got.equal(message(prev, rank, 0, 3)));
  const auto entries = cpprun::flight_recorder_entries();
  REQUIRE(entries.size() >= 2);
  const auto& sent = entries[entries.size() - 2];
  const auto& received = entries.back();
  CHECK(sent.op == "send");
  CHECK(sent.root == std::optional<int>(next));
  CHECK(sent.tag == std::optional<int>(11));
  CHECK(sent.label == std::optional<std::string>("ring: to the next rank"));
  CHECK(sent.state == cpprun::CollectiveState::kCompleted);
  CHECK(received.op == "recv");
  CHECK(received.root == std::optional<int>(prev));
  CHECK(received.dtype == std::optional<std::string>("float64"));
  CHECK(received.label == std::optional<std::string>("ring: from the previous rank"));
  CHECK(received.state == cpprun::CollectiveState::kCompleted);
}

TEST_CASE("batch_isend_irecv_agreed: messages of agreed size arrive by order and tag, recorded, apart from checked ones",
          "[p2p][batch]") {
  const int world = group().size(), rank = group().rank();
  if (world == 1) return;
  const int next = (rank + 1) % world, prev = (rank + world - 1) % world;
  for (int round = 0; round < 2; ++round) {
    // Two of one tag (told apart by order), one of another, a bf16 one (Gloo carries its bits),
    // and a checked message of the same tag in flight at once: each arrives where it was meant to.
    std::vector<at::Tensor> got = {at::zeros({5}, at::kDouble), at::zeros({5}, at::kDouble),
                                   at::zeros({1 << 16}, at::kDouble), at::zeros({7}, at::kBFloat16)};
    at::Tensor checked = at::zeros({3}, at::kDouble);
    auto checked_recv = cpprun::irecv(group(), checked, prev, 21);
    auto agreed = cpprun::detail::batch_isend_irecv_agreed(
        group(),
        {{kIrecv, got[0], prev, 21}, {kIsend, message(rank, next, round, 5), next, 21},
         {kIsend, message(rank, next, round + 10, 5), next, 21}, {kIrecv, got[1], prev, 21},
         {kIsend, message(rank, next, round, 1 << 16), next, 22}, {kIrecv, got[2], prev, 22},
         {kIsend, message(rank, next, round, 7).to(at::kBFloat16), next, 23}, {kIrecv, got[3], prev, 23}},
        {"first", "first", "second", "second", "large", "large", "bf16", "bf16"});
    auto checked_send = cpprun::isend(group(), message(rank, next, round + 20, 3), next, 21);
    wait_all(agreed);
    checked_recv.wait();
    checked_send.wait();
    INFO("round " << round);
    CHECK(got[0].equal(message(prev, rank, round, 5)));
    CHECK(got[1].equal(message(prev, rank, round + 10, 5)));
    CHECK(got[2].equal(message(prev, rank, round, 1 << 16)));
    CHECK(got[3].equal(message(prev, rank, round, 7).to(at::kBFloat16)));
    CHECK(checked.equal(message(prev, rank, round + 20, 3)));
  }
  // Each op is in the flight recorder, labelled and completed (the checked pair after them).
  const auto entries = cpprun::flight_recorder_entries();
  REQUIRE(entries.size() >= 10);
  const auto& large_recv = entries[entries.size() - 4];
  CHECK(large_recv.op == "recv");
  CHECK(large_recv.root == std::optional<int>(prev));
  CHECK(large_recv.tag == std::optional<int>(22));
  CHECK(large_recv.label == std::optional<std::string>("large"));
  CHECK(large_recv.state == cpprun::CollectiveState::kCompleted);
}

TEST_CASE("batch_isend_irecv: several messages between one pair arrive matched by order and tag", "[p2p][batch]") {
  const int world = group().size(), rank = group().rank();
  if (world == 1) return;
  // Rank 0 sends three (two of one tag and one size, to be told apart by order) and receives one
  // from rank 1 in the same batch; twice, so the second batch's places follow the first's.
  for (int round = 0; round < 2; ++round) {
    if (rank == 0) {
      at::Tensor back = at::zeros({6}, at::kDouble);
      auto works = cpprun::batch_isend_irecv(group(), {{kIsend, message(0, 1, 0, 5), 1, 7},
                                                       {kIrecv, back, 1, 8},
                                                       {kIsend, message(0, 1, 1, 5), 1, 7},
                                                       {kIsend, message(0, 1, 2, 9), 1, 2}});
      wait_all(works);
      CHECK(back.equal(message(1, 0, round, 6)));
    } else if (rank == 1) {
      std::vector<at::Tensor> got = {at::zeros({5}, at::kDouble), at::zeros({5}, at::kDouble),
                                     at::zeros({9}, at::kDouble)};
      auto works = cpprun::batch_isend_irecv(group(), {{kIsend, message(1, 0, round, 6), 0, 8},
                                                       {kIrecv, got[0], 0, 7},
                                                       {kIrecv, got[1], 0, 7},
                                                       {kIrecv, got[2], 0, 2}});
      wait_all(works);
      for (int k = 0; k < 3; ++k) {
        INFO("round " << round << " message " << k);
        CHECK(got[k].equal(message(0, 1, k, k == 2 ? 9 : 5)));
      }
    }
  }
  cpprun::barrier(group());
}

TEST_CASE("batch_isend_irecv: a receive that does not fit fails on both ranks, naming both", "[p2p][batch][mismatch]") {
  const int world = group().size(), rank = group().rank();
  if (world == 1) return;
  const cpprun::ProcessGroup pg = fresh_group();
  const std::string expected =
      "message with tag 4 mismatch: rank 0 called send/recv(float64[8], batched message #0), "
      "rank 1 called send/recv(float64[4], batched message #0)";
  if (rank == 0) {
    auto works = cpprun::batch_isend_irecv(pg, {{kIsend, at::ones({8}, at::kDouble), 1, 4}});
    CHECK_THROWS_WITH(works[0].wait(), Catch::Contains(expected) && Catch::Contains("found on rank 0"));
  } else if (rank == 1) {
    at::Tensor small = at::zeros({4}, at::kDouble);
    auto works = cpprun::batch_isend_irecv(pg, {{kIrecv, small, 0, 4}});
    CHECK_THROWS_WITH(works[0].wait(), Catch::Contains(expected) && Catch::Contains("found on rank 1"));
    CHECK(small.equal(at::zeros({4}, at::kDouble)));  // untouched
  }
  // The channel is clean: the next batched message on the same tag arrives whole.
  if (rank == 0) {
    auto works = cpprun::batch_isend_irecv(pg, {{kIsend, message(0, 1, 0, 4), 1, 4}});
    wait_all(works);
  } else if (rank == 1) {
    at::Tensor t = at::zeros({4}, at::kDouble);
    auto works = cpprun::batch_isend_irecv(pg, {{kIrecv, t, 0, 4}});
    wait_all(works);
    CHECK(t.equal(message(0, 1, 0, 4)));
  }
  cpprun::barrier(pg);
}

TEST_CASE("batch_isend_irecv: messages listed in another order, or batched at one end only, fail on both ranks",
          "[p2p][batch][mismatch]") {
  const int world = group().size(), rank = group().rank();
  if (world == 1) return;
  const cpprun::ProcessGroup pg = fresh_group();
  // Gloo would pair these by tag; NCCL pairs them by order and would swap them. Refused.
  const std::string swapped =
      "message with tag 1 mismatch: rank 0 called send/recv(float64[3], batched message #0), "
      "rank 1 called send/recv(float64[3], batched message #1)";
  const std::string why = "batched messages pair in the order each rank lists them";
  if (rank == 0) {
    auto works = cpprun::batch_isend_irecv(pg, {{kIsend, message(0, 1, 0, 3), 1, 1}, {kIsend, message(0, 1, 1, 3), 1, 2}});
    CHECK_THROWS_WITH(works[0].wait(), Catch::Contains(swapped) && Catch::Contains(why));
    CHECK_THROWS_WITH(works[1].wait(), Catch::Contains("message with tag 2 mismatch"));
  } else if (rank == 1) {
    at::Tensor a = at::zeros({3}, at::kDouble), b = at::zeros({3}, at::kDouble);
    auto works = cpprun::batch_isend_irecv(pg, {{kIrecv, b, 0, 2}, {kIrecv, a, 0, 1}});
    CHECK_THROWS_WITH(works[1].wait(), Catch::Contains(swapped) && Catch::Contains(why));
    CHECK_THROWS_WITH(works[0].wait(), Catch::Contains("message with tag 2 mismatch"));
  }
  // A batched send received singly (on NCCL they travel on different communicators).
  const std::string one_end =
      "message with tag 6 mismatch: rank 0 called send/recv(float64[2], batched message #2), "
      "rank 1 called send/recv(float64[2])";
  if (rank == 0) {
    auto works = cpprun::batch_isend_irecv(pg, {{kIsend, message(0, 1, 0, 2), 1, 6}});
    CHECK_THROWS_WITH(works[0].wait(), Catch::Contains(one_end) && Catch::Contains("batch both ends"));
  } else if (rank == 1) {
    CHECK_THROWS_WITH(cpprun::recv(pg, at::zeros({2}, at::kDouble), 0, 6),
                      Catch::Contains(one_end) && Catch::Contains("batch both ends"));
  }
  cpprun::barrier(pg);
}

TEST_CASE("batch_isend_irecv: bad input is refused before anything is sent", "[p2p][batch]") {
  const int world = group().size(), rank = group().rank();
  const auto x = [] { return at::ones({2}, at::kDouble); };
  CHECK_THROWS_WITH(cpprun::batch_isend_irecv(group(), {}), Catch::Contains("the list of ops is empty"));
  if (world == 1) return;
  const cpprun::ProcessGroup pg = fresh_group();
  const int next = (rank + 1) % world;
  // Each refused list starts with a good send: had it gone out, the exchange below would get it.
  const P2POp good = {kIsend, at::full({2}, -1.0, at::kDouble), next, 5};
  CHECK_THROWS_WITH(cpprun::batch_isend_irecv(pg, {good, {kIrecv, x(), cpprun::kAnySource, 5}}),
                    Catch::Contains("op 1 (irecv) receives from kAnySource") && Catch::Contains("cpprun::irecv"));
  CHECK_THROWS_WITH(cpprun::batch_isend_irecv(pg, {good, {kIsend, x(), rank, 5}}),
                    Catch::Contains("op 1 (isend): rank " + std::to_string(rank) + " cannot message itself"));
  CHECK_THROWS_WITH(cpprun::batch_isend_irecv(pg, {good, {kIrecv, x(), world, 5}}),
                    Catch::Contains("op 1 (irecv): src " + std::to_string(world) + " is not a rank of this group"));
  CHECK_THROWS_WITH(cpprun::batch_isend_irecv(pg, {good, {kIsend, x(), next, -1}}),
                    Catch::Contains("op 1 (isend): tag -1 is outside"));
  CHECK_THROWS_WITH(cpprun::batch_isend_irecv(pg, {good, {kIrecv, at::Tensor(), next, 5}}),
                    Catch::Contains("op 1 (irecv): tensor is an undefined tensor"));
  CHECK_THROWS_WITH(cpprun::batch_isend_irecv(pg, {good, {kIsend, x().expand({2, 2}), next, 5}}),
                    Catch::Contains("not contiguous"));
  // A tensor on another device (meta here; a CPU one beside CUDA ones on a GPU machine).
  CHECK_THROWS_WITH(cpprun::batch_isend_irecv(pg, {good, {kIsend, at::empty({2}, at::device(at::kMeta)), next, 5}}),
                    Catch::Contains("op 1 (isend)'s tensor is on meta but op 0's is on cpu") &&
                        Catch::Contains("one batch per device"));
  // Nothing went out: the ring's first batched messages are these, at place #0.
  const int prev = (rank + world - 1) % world;
  at::Tensor got = at::zeros({2}, at::kDouble);
  auto works = cpprun::batch_isend_irecv(pg, {{kIsend, message(rank, next, 0, 2), next, 5}, {kIrecv, got, prev, 5}});
  wait_all(works);
  CHECK(got.equal(message(prev, rank, 0, 2)));
  cpprun::barrier(pg);
}
