// Collectives on the real process group, run under `cpprun --nproc_per_node=K` for K = 1..4.
// Every rank checks its result against values computed locally. Checks use CHECK, not REQUIRE,
// so a failing rank still makes the same sequence of collective calls as the others.
#include "catch.h"
#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include "comm/group_impl.h"  // p2p_bytes_sent
#include "comm/rank_join.h"
#include "cpprun/cpprun.h"
#include "dist_test_support.h"

using cpprun::ReduceOp;

namespace {

using dist_test::group;

// Sizes that do and do not divide by 2, 3 and 4.
const std::vector<int64_t> kSizes = {1, 7, 1001, 4099};
const std::vector<at::ScalarType> kTypes = {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16};

// Rank r's contribution: (r + 1) * (i % 7 + 1): small integers, exact in every type tested.
at::Tensor contribution(int rank, int64_t n, at::ScalarType type) {
  return ((at::arange(n, at::kLong) % 7 + 1) * (rank + 1)).to(type);
}

// What reducing every rank's contribution gives, computed locally in double.
at::Tensor expected_reduction(int64_t n, ReduceOp op, int world) {
  at::Tensor base = (at::arange(n, at::kLong) % 7 + 1).to(at::kDouble);
  switch (op) {
    case ReduceOp::kSum: return base * (world * (world + 1) / 2);
    case ReduceOp::kAvg: return base * ((world + 1) / 2.0);
    case ReduceOp::kMax: return base * world;
    case ReduceOp::kMin: return base;
    default: break;
  }
  FAIL("expected_reduction: " << cpprun::to_string(op));
  return base;
}

// Rank r's factors and bits for the product and bitwise reductions: factors 1..3, whose product
// over four ranks (at most 81) is exact in every type; bits that differ between ranks (bool: true
// at the multiples of r + 2).
at::Tensor factors_of(int rank, int64_t n, at::ScalarType type) {
  return ((at::arange(n, at::kLong) + rank) % 3 + 1).to(type);
}
at::Tensor bits_of(int rank, int64_t n, at::ScalarType type) {
  if (type == at::kBool) return at::arange(n, at::kLong) % (rank + 2) == 0;
  return ((at::arange(n, at::kLong) * 37 + rank * 11 + 5) % 128).to(type);
}

// Every rank's tensor reduced by `op`, computed locally in int64.
at::Tensor reduced_locally(ReduceOp op, int world, const std::function<at::Tensor(int)>& of_rank) {
  at::Tensor acc = of_rank(0).to(at::kLong);
  for (int r = 1; r < world; ++r) {
    const at::Tensor x = of_rank(r).to(at::kLong);
    switch (op) {
      case ReduceOp::kProduct: acc = acc * x; break;
      case ReduceOp::kBAnd: acc = acc.bitwise_and(x); break;
      case ReduceOp::kBOr: acc = acc.bitwise_or(x); break;
      case ReduceOp::kBXor: acc = acc.bitwise_xor(x); break;
      default: FAIL("reduced_locally: " << cpprun::to_string(op));
    }
  }
  return acc;
}

// What rank r holds before a broadcast: contribution(), except in bool, where contribution() is
// true everywhere on every rank (a broadcast that did nothing would pass): true at the multiples
// of r + 2, a different pattern on each rank.
at::Tensor before_broadcast(int rank, int64_t n, at::ScalarType type) {
  if (type == at::kBool) return at::arange(n, at::kLong) % (rank + 2) == 0;
  return contribution(rank, n, type);
}

bool equal_as_double(const at::Tensor& actual, const at::Tensor& expected) {
  return at::allclose(actual.to(at::kDouble), expected.to(at::kDouble), 1e-6, 1e-6);
}

}  // namespace

TEST_CASE("collectives: the group matches the launcher's environment", "[collectives]") {
  const auto env = cpprun::read_dist_env();
  CHECK(group().rank() == env.rank);
  CHECK(group().size() == env.world_size);
  CHECK(cpprun::rank() == env.rank);
  CHECK(cpprun::world_size() == env.world_size);
  CHECK(cpprun::local_device().is_cpu());
}

// What kAuto and local_device() follow (Note [One device choice per job]). The GPUs of a node
// cannot be faked on a CPU machine, so the votes are given directly.
TEST_CASE("collectives: one rank without a GPU makes every rank's answer the CPU", "[collectives]") {
  const auto& impl = cpprun::detail::impl_of(group());
  const std::chrono::seconds timeout(30);
  const auto vote = [&](const std::string& round, bool has_gpu) {
    c10d::PrefixStore store("gpu_vote/" + round, impl.store);
    return cpprun::detail::join_ranks(store, impl.env, timeout, has_gpu).every_rank_has_gpu;
  };
  CHECK(vote("all", true));
  CHECK_FALSE(vote("none", false));
  for (int without = 0; without < impl.env.world_size; ++without) {
    CHECK_FALSE(vote("without_" + std::to_string(without), impl.env.rank != without));
  }
}

// A then-step that threw is not run again by a later wait, which rethrows its error: a step
// issues collectives (PowerSGD's Q all-reduce), and one issued again by a rank alone would be
// matched with whatever the others issue next.
TEST_CASE("collectives: a work's then-step that threw runs once; later waits rethrow its error", "[collectives]") {
  int runs = 0;
  at::Tensor t = at::ones({4});
  cpprun::Work work = cpprun::all_reduce_async(group(), t).then([&] {
    ++runs;
    cpprun::all_reduce(group(), t);  // the collective the step issues: once on every rank
    throw std::runtime_error("the step failed after its all-reduce");
  });
  CHECK_THROWS_WITH(work.wait(), Catch::Contains("the step failed after its all-reduce"));
  CHECK_THROWS_WITH(work.wait(), Catch::Contains("the step failed after its all-reduce"));
  CHECK(runs == 1);
  const double world = group().size();
  CHECK(t.equal(at::full({4}, world * world)));
  cpprun::barrier(group());  // a second all-reduce issued by the step would be met here
}

TEST_CASE("collectives: all_reduce sum, avg, max, min over sizes and types", "[collectives]") {
  const int world = group().size(), rank = group().rank();
  for (auto type : kTypes) {
    for (auto n : kSizes) {
      for (auto op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
        at::Tensor t = contribution(rank, n, type);
        cpprun::all_reduce(group(), t, op);
        INFO("type " << type << " n " << n << " op " << cpprun::to_string(op));
        CHECK(t.scalar_type() == type);
        CHECK(equal_as_double(t, expected_reduction(n, op, world)));
      }
    }
  }
}

TEST_CASE("collectives: all_reduce of integer tensors sums exactly", "[collectives]") {
  const int world = group().size(), rank = group().rank();
  at::Tensor t = at::full({3}, int64_t{1} << 40, at::kLong) + rank;
  cpprun::all_reduce(group(), t);
  const int64_t expected = world * (int64_t{1} << 40) + world * (world - 1) / 2;
  CHECK(t.equal(at::full({3}, expected, at::kLong)));
  CHECK_THROWS_WITH(cpprun::all_reduce(group(), t, ReduceOp::kAvg), Catch::Contains("floating-point"));
}

// Note [Reductions Gloo cannot do]: unsigned and complex tensors went through float32, which
// rounded 2^24 + 1 and dropped imaginary parts, with exit 0 (PyTorch's Gloo refuses them).
TEST_CASE("collectives: unsigned, int16, bool and complex reductions are exact", "[collectives]") {
  const int world = group().size(), rank = group().rank();
  for (const auto type : {at::kUInt32, at::kUInt16}) {
    const int64_t base = type == at::kUInt32 ? (int64_t{1} << 24) + 1 : 30001;
    at::Tensor t = at::full({3}, base + rank, at::kLong).to(type);
    cpprun::all_reduce(group(), t);
    // The sum in the type itself, wrapping as it does.
    const int64_t sum = world * base + world * (world - 1) / 2;
    const int64_t wrapped = type == at::kUInt32 ? sum % (int64_t{1} << 32) : sum % 65536;
    INFO(type);
    CHECK(t.to(at::kLong).equal(at::full({3}, wrapped, at::kLong)));
    at::Tensor m = at::full({3}, base + rank, at::kLong).to(type);
    cpprun::all_reduce(group(), m, ReduceOp::kMax);
    CHECK(m.to(at::kLong).equal(at::full({3}, base + world - 1, at::kLong)));
  }
  // uint64: the sum wraps at 2^64; max and min in unsigned order: odd ranks hold values above
  // 2^63 (negative as int64), even ranks small ones, so signed order would pick the wrong ones.
  const uint64_t big = (uint64_t{1} << 63) + 5;
  const auto value_of = [&](int r) { return r % 2 == 1 ? big + static_cast<uint64_t>(r) : static_cast<uint64_t>(r); };
  at::Tensor u = at::empty({1}, at::kUInt64);
  const uint64_t mine = value_of(rank);
  std::memcpy(u.data_ptr(), &mine, sizeof mine);
  at::Tensor u_max = u.clone(), u_min = u.clone(), u_reduced = u.clone();
  cpprun::all_reduce(group(), u);
  cpprun::all_reduce(group(), u_max, ReduceOp::kMax);
  cpprun::all_reduce(group(), u_min, ReduceOp::kMin);
  cpprun::reduce(group(), u_reduced, /*root=*/world - 1, ReduceOp::kMax);
  const auto value = [](const at::Tensor& t) { return *static_cast<const uint64_t*>(t.data_ptr()); };
  uint64_t sum = 0, largest = 0;
  for (int r = 0; r < world; ++r) sum += value_of(r), largest = std::max(largest, value_of(r));  // wraps as uint64
  CHECK(value(u) == sum);
  CHECK(value(u_max) == largest);
  CHECK(value(u_min) == 0);
  // reduce: the root gets the maximum; the other ranks' tensors are left as they were.
  CHECK(value(u_reduced) == (rank == world - 1 ? largest : mine));
  // int16 and bool: exact in their own type (int16 wraps; bool's sum and max are any, min all).
  at::Tensor s16 = at::full({2}, 30000 + rank, at::kShort);
  cpprun::all_reduce(group(), s16);
  CHECK(s16.equal(at::full({2}, world * 30000 + world * (world - 1) / 2, at::kLong).to(at::kShort)));
  at::Tensor any = at::full({2}, rank == 0, at::kBool), all = any.clone();
  cpprun::all_reduce(group(), any);
  cpprun::all_reduce(group(), all, ReduceOp::kMin);
  CHECK(any.all().item<bool>());
  CHECK(all.any().item<bool>() == (world == 1));
  // Complex: sum and average, imaginary parts kept; no order, so max / min are refused.
  for (const auto type : {at::kComplexFloat, at::kComplexDouble}) {
    at::Tensor z = at::complex(at::full({2}, 1.0 + rank), at::full({2}, 10.0 * (rank + 1))).to(type);
    at::Tensor avg = z.clone();
    cpprun::all_reduce(group(), z);
    cpprun::all_reduce(group(), avg, ReduceOp::kAvg);
    const double real = world + world * (world - 1) / 2.0, imag = 10.0 * world * (world + 1) / 2.0;
    INFO(type);
    CHECK(at::allclose(at::view_as_real(z), at::view_as_real(at::complex(at::full({2}, real), at::full({2}, imag)).to(type))));
    CHECK(at::allclose(at::view_as_real(avg),
                       at::view_as_real(at::complex(at::full({2}, real / world), at::full({2}, imag / world)).to(type))));
    CHECK_THROWS_WITH(cpprun::all_reduce(group(), z, ReduceOp::kMax), Catch::Contains("complex numbers have no order"));
    // reduce to rank 0: the root's sum; the others' tensors untouched (their wire is a view).
    at::Tensor mine_z = at::complex(at::full({2}, 1.0 + rank), at::full({2}, 10.0 * (rank + 1))).to(type);
    at::Tensor reduced = mine_z.clone();
    cpprun::reduce(group(), reduced, /*root=*/0);
    CHECK(at::allclose(at::view_as_real(reduced), at::view_as_real(rank == 0 ? z : mine_z)));
  }
  at::Tensor half = at::complex(at::full({2}, 1.0), at::full({2}, 2.0)).to(at::kComplexHalf);
  cpprun::all_reduce(group(), half);
  CHECK(at::view_as_real(half).to(at::kFloat).equal(
      at::view_as_real(at::complex(at::full({2}, 1.0 * world), at::full({2}, 2.0 * world))).to(at::kFloat)));
  if (world > 1) {
    at::Tensor in = at::zeros({world}, at::kLong).to(at::kUInt32), out = at::zeros({1}, at::kLong).to(at::kUInt32);
    CHECK_THROWS_WITH(cpprun::reduce_scatter(group(), out, in), Catch::Contains("reduce an int64 copy"));
  }
}

// torch.distributed's PRODUCT, BAND, BOR and BXOR: every type Gloo reduces and those that travel
// as another (int16 and bool as int32, Note [Reductions Gloo cannot do]), through all_reduce,
// reduce and our reduce-scatter ring.
TEST_CASE("collectives: product and bitwise reductions, as PyTorch's PRODUCT, BAND, BOR, BXOR", "[collectives]") {
  const int world = group().size(), rank = group().rank();
  const std::vector<at::ScalarType> integers = {at::kByte, at::kChar, at::kShort, at::kInt, at::kLong, at::kBool};
  std::vector<std::pair<ReduceOp, at::ScalarType>> cases;
  for (auto type : {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16}) cases.push_back({ReduceOp::kProduct, type});
  for (auto type : integers) {
    for (auto op : {ReduceOp::kProduct, ReduceOp::kBAnd, ReduceOp::kBOr, ReduceOp::kBXor}) cases.push_back({op, type});
  }
  for (const auto& [op, type] : cases) {
    for (const int64_t n : {int64_t{7}, int64_t{1001}}) {
      INFO("type " << type << " n " << n << " op " << cpprun::to_string(op));
      const auto of = [&](int r, int64_t count) {
        return op == ReduceOp::kProduct ? factors_of(r, count, type) : bits_of(r, count, type);
      };
      const at::Tensor expected = reduced_locally(op, world, [&](int r) { return of(r, n); });
      at::Tensor all = of(rank, n), root_only = of(rank, n);
      cpprun::all_reduce(group(), all, op);
      CHECK(all.scalar_type() == type);
      CHECK(all.to(at::kLong).equal(expected));
      cpprun::reduce(group(), root_only, /*root=*/world - 1, op);
      CHECK(root_only.to(at::kLong).equal(rank == world - 1 ? expected : of(rank, n).to(at::kLong)));
      at::Tensor chunk = at::empty({n}, type);
      cpprun::reduce_scatter(group(), chunk, of(rank, world * n), op);
      const at::Tensor whole = reduced_locally(op, world, [&](int r) { return of(r, world * n); });
      CHECK(chunk.to(at::kLong).equal(whole.narrow(0, rank * n, n)));
    }
  }
  // uint64 travels as its bits: products and xor wrap as in the type, above 2^63 too.
  const uint64_t big = (uint64_t{1} << 63) + 3;
  const auto value_of = [&](int r) { return big + 2 * static_cast<uint64_t>(r); };
  at::Tensor product = at::empty({1}, at::kUInt64);
  const uint64_t mine = value_of(rank);
  std::memcpy(product.data_ptr(), &mine, sizeof mine);
  at::Tensor bxor = product.clone();
  cpprun::all_reduce(group(), product, ReduceOp::kProduct);
  cpprun::all_reduce(group(), bxor, ReduceOp::kBXor);
  uint64_t expected_product = 1, expected_xor = 0;
  for (int r = 0; r < world; ++r) expected_product *= value_of(r), expected_xor ^= value_of(r);
  CHECK(*static_cast<const uint64_t*>(product.data_ptr()) == expected_product);
  CHECK(*static_cast<const uint64_t*>(bxor.data_ptr()) == expected_xor);
  // Bitwise reductions need integers or bools; complex numbers take sum and average only.
  at::Tensor floats = at::ones({2});
  CHECK_THROWS_WITH(cpprun::all_reduce(group(), floats, ReduceOp::kBOr),
                    Catch::Contains("ReduceOp bor needs an integer or bool tensor, got Float"));
  at::Tensor z = at::ones({2}, at::kComplexFloat);
  CHECK_THROWS_WITH(cpprun::all_reduce(group(), z, ReduceOp::kProduct),
                    Catch::Contains("ReduceOp product of a ComplexFloat tensor"));
}

// A tensor without memory (a meta tensor; a deferred one, cpprun::deferred_init, not yet
// materialised) went to Gloo's socket from a null address, which aborted the process.
TEST_CASE("collectives: a tensor without memory is refused by name", "[collectives]") {
  at::Tensor meta = at::empty({4}, at::TensorOptions().device(at::kMeta));
  CHECK_THROWS_WITH(cpprun::broadcast(group(), meta),
                    Catch::Contains("has no memory: a meta tensor, or a deferred one"));
  CHECK_THROWS_WITH(cpprun::all_reduce(group(), meta), Catch::Contains("has no memory"));
  at::Tensor deferred = cpprun::deferred_init([] { return at::zeros({4}); });
  CHECK_THROWS_WITH(cpprun::all_reduce(group(), deferred), Catch::Contains("has no memory"));
  at::Tensor empty = at::empty({0});  // no elements: nothing to send, accepted
  cpprun::all_reduce(group(), empty);
}

// at::conj of a complex tensor is lazy: its memory holds the unconjugated values and a flag says
// so. Moved as memory they arrived unconjugated (all_gather_into, reduce_scatter, send: each rank
// got its peers' chunks unconjugated); every collective refuses such a tensor by name, as PyTorch.
TEST_CASE("collectives: a lazily conjugated or negated tensor is refused by name", "[collectives]") {
  const int world = group().size(), rank = group().rank();
  const at::Tensor z = at::conj(at::complex(at::arange(3, at::kFloat), at::arange(3, at::kFloat) + 10));
  REQUIRE(z.is_conj());
  // Named apart: a Catch2 v2 matcher made by && holds its operands by reference.
  const auto conjugated = Catch::Contains("lazily conjugated (at::conj)");
  const auto resolve = Catch::Contains("resolve_conj()");
  CHECK_THROWS_WITH(cpprun::all_reduce(group(), z), conjugated && resolve);
  CHECK_THROWS_WITH(cpprun::broadcast(group(), z), conjugated && resolve);
  at::Tensor out = at::zeros({3 * world}, at::kComplexFloat);
  CHECK_THROWS_WITH(cpprun::all_gather_into(group(), out, z), conjugated && resolve);
  CHECK_THROWS_WITH(cpprun::all_gather_into(group(), at::conj(out), z.resolve_conj()),
                    conjugated && resolve && Catch::Contains("output"));
  at::Tensor chunk = at::zeros({3}, at::kComplexFloat);
  CHECK_THROWS_WITH(cpprun::reduce_scatter(group(), chunk, at::conj(at::zeros({3 * world}, at::kComplexFloat))),
                    conjugated && resolve);
  if (world > 1) CHECK_THROWS_WITH(cpprun::send(group(), z, (rank + 1) % world), conjugated && resolve);
  const at::Tensor negated = at::arange(3, at::kFloat)._neg_view();
  REQUIRE(negated.is_neg());
  CHECK_THROWS_WITH(cpprun::all_reduce(group(), negated),
                    Catch::Contains("lazily negated") && Catch::Contains("resolve_neg()"));
  // Resolved, it travels as it shows.
  cpprun::all_gather_into(group(), out, z.resolve_conj());
  for (int r = 0; r < world; ++r) CHECK(out.narrow(0, 3 * r, 3).equal(z.resolve_conj()));
}

// PyTorch's names (all_gather_into_tensor, reduce_scatter_tensor, all_to_all_single) are the same
// calls as cpprun's.
TEST_CASE("collectives: PyTorch's names of the tensor collectives give the same results", "[collectives]") {
  const int world = group().size(), rank = group().rank();
  at::Tensor gathered = at::zeros({2 * world});
  cpprun::all_gather_into_tensor(group(), gathered, at::full({2}, static_cast<float>(rank)));
  for (int r = 0; r < world; ++r) CHECK(gathered.narrow(0, 2 * r, 2).equal(at::full({2}, static_cast<float>(r))));
  at::Tensor chunk = at::zeros({2});
  cpprun::reduce_scatter_tensor(group(), chunk, at::arange(2 * world, at::kFloat), cpprun::ReduceOp::kMax);
  CHECK(chunk.equal(at::arange(2 * rank, 2 * rank + 2, at::kFloat)));
  at::Tensor exchanged = at::zeros({world});
  cpprun::all_to_all_single(group(), exchanged, at::full({world}, static_cast<float>(rank)));
  CHECK(exchanged.equal(at::arange(world, at::kFloat)));
}

// A result that requires grad (a parameter, say) is written in place by every collective, as
// c10d's all_reduce and broadcast write it in both frameworks: the ring's copies went through
// autograd's in-place check instead, which threw after part of the result was written, on the
// ranks whose tensor required grad only (PyTorch's Gloo throws there too, at reduce_scatter_tensor
// and all_gather). A refusal on some ranks would leave the others waiting in the collective.
TEST_CASE("collectives: a result that requires grad is written in place by every collective", "[collectives]") {
  const int world = group().size(), rank = group().rank();
  const auto leaf = [](int64_t n) { return at::zeros({n}, at::kFloat).requires_grad_(); };
  const auto ones = [](int64_t n) { return at::ones({n}, at::kFloat); };
  at::Tensor gathered = leaf(2 * world);
  cpprun::all_gather_into(group(), gathered, at::full({2}, static_cast<float>(rank)));
  for (int r = 0; r < world; ++r) CHECK(gathered.narrow(0, 2 * r, 2).equal(at::full({2}, static_cast<float>(r))));
  at::Tensor chunk = leaf(2);
  cpprun::reduce_scatter(group(), chunk, ones(2 * world));
  CHECK(chunk.equal(at::full({2}, static_cast<float>(world))));
  std::vector<at::Tensor> uneven;
  for (int r = 0; r < world; ++r) uneven.push_back(leaf(r + 1));
  cpprun::all_gather(group(), uneven, at::full({rank + 1}, static_cast<float>(rank)));
  for (int r = 0; r < world; ++r) CHECK(uneven[r].equal(at::full({r + 1}, static_cast<float>(r))));
  std::vector<at::Tensor> at_root;
  if (rank == 0) for (int r = 0; r < world; ++r) at_root.push_back(leaf(2));
  cpprun::gather(group(), at::full({2}, static_cast<float>(rank)), at_root, 0);
  for (int r = 0; r < static_cast<int>(at_root.size()); ++r) {
    CHECK(at_root[r].equal(at::full({2}, static_cast<float>(r))));
  }
  at::Tensor scattered = leaf(2);
  std::vector<at::Tensor> pieces;
  if (rank == 0) for (int r = 0; r < world; ++r) pieces.push_back(at::full({2}, static_cast<float>(r)));
  cpprun::scatter(group(), scattered, pieces, 0);
  CHECK(scattered.equal(at::full({2}, static_cast<float>(rank))));
  at::Tensor exchanged = leaf(world);
  cpprun::all_to_all(group(), exchanged, at::full({world}, static_cast<float>(rank)));
  CHECK(exchanged.equal(at::arange(world, at::kFloat)));
  at::Tensor summed = leaf(3);
  summed.detach().fill_(1);
  cpprun::all_reduce(group(), summed);
  CHECK(summed.equal(at::full({3}, static_cast<float>(world))));
  cpprun::all_reduce(group(), summed, cpprun::ReduceOp::kAvg);  // its division runs after Gloo's sum
  CHECK(summed.equal(at::full({3}, static_cast<float>(world))));
  at::Tensor reduced = leaf(3);
  reduced.detach().fill_(1);
  cpprun::reduce(group(), reduced, 0);
  CHECK(reduced.equal(at::full({3}, rank == 0 ? static_cast<float>(world) : 1.0F)));
  at::Tensor sent = leaf(3);
  if (rank == 0) sent.detach().fill_(7);
  cpprun::broadcast(group(), sent, 0);
  CHECK(sent.equal(at::full({3}, 7.0F)));
  if (world > 1) {
    at::Tensor message = leaf(3);
    if (rank == 0) cpprun::send(group(), at::full({3}, 5.0F), 1);
    if (rank == 1) {
      cpprun::recv(group(), message, 0);
      CHECK(message.equal(at::full({3}, 5.0F)));
    }
  }
  // Still leaves that require grad, and the group still in step.
  CHECK((gathered.is_leaf() && gathered.requires_grad() && chunk.requires_grad()));
  at::Tensor after = at::ones({1});
  cpprun::all_reduce(group(), after);
  CHECK(after.item<float>() == static_cast<float>(world));
}

// PyTorch's is_completed() true means the tensors hold the result. An average's division (and a
// type carried as another, written back) ran only in wait(): code that polled read the sum.
TEST_CASE("collectives: is_completed() true means the result is in place, before wait()", "[collectives]") {
  const int world = group().size(), rank = group().rank();
  at::Tensor average = at::full({3}, static_cast<float>(rank + 1));
  at::Tensor any = at::tensor({0, rank == 0 ? 1 : 0}, at::kLong).to(at::kBool);
  cpprun::Work averaged = cpprun::all_reduce_async(group(), average, cpprun::ReduceOp::kAvg);
  cpprun::Work summed = cpprun::all_reduce_async(group(), any);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!(averaged.is_completed() && summed.is_completed()) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  REQUIRE(averaged.is_completed());
  CHECK(average.equal(at::full({3}, (world + 1) / 2.0F)));
  CHECK(any.equal(at::tensor({0, 1}, at::kLong).to(at::kBool)));
  averaged.wait();
  summed.wait();
  CHECK(average.equal(at::full({3}, (world + 1) / 2.0F)));
}

TEST_CASE("collectives: broadcast from every root, every type", "[collectives]") {
  const int world = group().size(), rank = group().rank();
  for (auto type : {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16, at::kBool, at::kLong}) {
    for (int root = 0; root < world; ++root) {
      at::Tensor t = before_broadcast(rank, 1001, type);
      cpprun::broadcast(group(), t, root);
      INFO("type " << type << " root " << root);
      CHECK(t.equal(before_broadcast(root, 1001, type)));
    }
  }
  at::Tensor t = at::zeros({2});
  CHECK_THROWS_WITH(cpprun::broadcast(group(), t, world), Catch::Contains("root"));
}

TEST_CASE("collectives: all_gather_into concatenates in rank order", "[collectives]") {
  const int world = group().size(), rank = group().rank();
  for (auto type : kTypes) {
    for (auto n : kSizes) {
      at::Tensor output = at::zeros({world * n}, type);
      cpprun::all_gather_into(group(), output, contribution(rank, n, type));
      std::vector<at::Tensor> parts;
      for (int r = 0; r < world; ++r) parts.push_back(contribution(r, n, type));
      INFO("type " << type << " n " << n);
      CHECK(output.equal(at::cat(parts)));
    }
  }
  at::Tensor wrong = at::zeros({world * 5 + 1});
  CHECK_THROWS_WITH(cpprun::all_gather_into(group(), wrong, at::zeros({5})),
                    Catch::Contains("needs world_size"));
}

TEST_CASE("collectives: reduce_scatter gives each rank its reduced chunk", "[collectives]") {
  const int world = group().size(), rank = group().rank();
  for (auto type : kTypes) {
    for (auto n : kSizes) {  // n elements per rank: world * n in all, any remainder mod world
      for (auto op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
        at::Tensor input = contribution(rank, world * n, type);
        at::Tensor output = at::empty({n}, type);
        cpprun::reduce_scatter(group(), output, input, op);
        at::Tensor expected = expected_reduction(world * n, op, world).narrow(0, rank * n, n);
        INFO("type " << type << " n " << n << " op " << cpprun::to_string(op));
        CHECK(equal_as_double(output, expected));
      }
    }
  }
  at::Tensor out = at::zeros({4});
  CHECK_THROWS_WITH(cpprun::reduce_scatter(group(), out, at::zeros({world * 4 + 1})),
                    Catch::Contains("Pad the input"));
}

TEST_CASE("collectives: reduce_scatter in place, into the rank's own chunk of the input", "[collectives]") {
  const int world = group().size(), rank = group().rank();
  for (int64_t n : {1, 1001}) {
    at::Tensor input = contribution(rank, world * n, at::kFloat);
    at::Tensor own_chunk = input.narrow(0, rank * n, n);  // as NCCL allows: output inside input
    cpprun::reduce_scatter(group(), own_chunk, input);
    INFO("n " << n);
    CHECK(equal_as_double(own_chunk, expected_reduction(world * n, ReduceOp::kSum, world).narrow(0, rank * n, n)));
  }
}

TEST_CASE("collectives: reduce_scatter sends (N-1)/N of its input per rank", "[collectives]") {
  const int world = group().size(), rank = group().rank();
  const int64_t n = 10000;  // elements per rank's output chunk
  at::Tensor input = contribution(rank, world * n, at::kFloat);
  at::Tensor output = at::empty({n}, at::kFloat);
  const uint64_t before = cpprun::detail::impl_of(group()).p2p_bytes_sent;
  cpprun::reduce_scatter(group(), output, input);
  const uint64_t sent = cpprun::detail::impl_of(group()).p2p_bytes_sent - before;
  // A native reduce-scatter moves (N-1)/N of the input; all-reduce-then-slice twice that.
  CHECK(sent == static_cast<uint64_t>(world - 1) * n * sizeof(float));
}

TEST_CASE("collectives: async operations overlap and complete in any wait order", "[collectives]") {
  const int world = group().size(), rank = group().rank();
  const int64_t n = 3001;
  std::vector<at::Tensor> reduced, scattered;
  std::vector<cpprun::Work> works;
  for (int i = 0; i < 4; ++i) {
    reduced.push_back(contribution(rank, n, at::kFloat) * (i + 1));
    works.push_back(cpprun::all_reduce_async(group(), reduced.back()));
    scattered.push_back(at::empty({n}, at::kFloat));
    works.push_back(cpprun::reduce_scatter_async(group(), scattered.back(),
                                                 contribution(rank, world * n, at::kFloat) * (i + 1)));
  }
  works.push_back(cpprun::barrier_async(group()));
  for (auto it = works.rbegin(); it != works.rend(); ++it) it->wait();  // newest first
  for (auto& work : works) {
    CHECK(work.is_completed());
    work.wait();  // a second wait is harmless
  }
  for (int i = 0; i < 4; ++i) {
    CHECK(equal_as_double(reduced[i], expected_reduction(n, ReduceOp::kSum, world) * (i + 1)));
    CHECK(equal_as_double(scattered[i],
                          (expected_reduction(world * n, ReduceOp::kSum, world) * (i + 1)).narrow(0, rank * n, n)));
  }
}

// An input inside the output is this rank's own chunk (in place) or refused: elsewhere the ring
// overwrote it before sending it (wrong 3 runs of 4). all_to_all never runs in place.
TEST_CASE("collectives: inputs that overlap the output are its own chunk or refused", "[collectives]") {
  const int world = group().size(), rank = group().rank();
  at::Tensor out = at::zeros({world * 2}, at::kLong);
  out.narrow(0, 2 * rank, 2).fill_(rank + 1);
  cpprun::all_gather_into(group(), out, out.narrow(0, 2 * rank, 2));  // in place
  CHECK(out.equal(at::arange(1, world + 1, at::kLong).repeat_interleave(2)));
  if (world > 1) {
    const int other = (rank + 1) % world;
    CHECK_THROWS_WITH(cpprun::all_gather_into(group(), out, out.narrow(0, 2 * other, 2)),
                      Catch::Contains("other than as this rank's own chunk"));
  }
  at::Tensor rows = at::zeros({world, 2}, at::kLong);
  CHECK_THROWS_WITH(cpprun::all_to_all(group(), rows, rows), Catch::Contains("cannot run in place"));
  cpprun::barrier(group());
}

TEST_CASE("collectives: multidimensional and non-contiguous tensors", "[collectives]") {
  const int world = group().size(), rank = group().rank();
  at::Tensor matrix = contribution(rank, 12, at::kFloat).view({3, 4});
  cpprun::all_reduce(group(), matrix);
  CHECK(equal_as_double(matrix.view({12}), expected_reduction(12, ReduceOp::kSum, world)));
  at::Tensor transposed = at::zeros({3, 4}).t();
  CHECK_THROWS_WITH(cpprun::all_reduce(group(), transposed), Catch::Contains("not contiguous"));
  cpprun::barrier(group());
}

TEST_CASE("collectives: the flight recorder holds each call with its group, number and state", "[collectives][flight_recorder]") {
  const int world = group().size();
  if (world == 1) return;  // a world of one communicates nothing, and records nothing
  cpprun::all_reduce(group(), at::ones({5}), ReduceOp::kMax);
  cpprun::Work work = cpprun::broadcast_async(group(), at::ones({2, 3}, at::kDouble), world - 1);
  const auto before_wait = cpprun::flight_recorder_entries();
  work.wait();
  const auto entries = cpprun::flight_recorder_entries();
  REQUIRE(entries.size() >= 2);
  CHECK(before_wait.back().state == cpprun::CollectiveState::kStarted);  // until its wait
  CHECK_FALSE(before_wait.back().end_unix_ms.has_value());

  const auto& reduced = entries[entries.size() - 2];
  const auto& broadcast = entries.back();
  std::vector<int> all(world);
  for (int r = 0; r < world; ++r) all[r] = r;
  CHECK(reduced.group == "0");
  CHECK(reduced.group_ranks == all);
  CHECK(reduced.op == "all_reduce");
  CHECK(reduced.dtype == std::optional<std::string>("float32"));
  CHECK(reduced.shapes == std::vector<std::vector<int64_t>>{{5}});
  CHECK(reduced.reduce_op == std::optional<std::string>("max"));
  CHECK_FALSE(reduced.root.has_value());
  CHECK(reduced.state == cpprun::CollectiveState::kCompleted);
  CHECK(reduced.end_unix_ms.value_or(0) >= reduced.start_unix_ms);
  CHECK(broadcast.seq == reduced.seq + 1);
  CHECK(broadcast.op == "broadcast");
  CHECK(broadcast.dtype == std::optional<std::string>("float64"));
  CHECK(broadcast.shapes == std::vector<std::vector<int64_t>>{{2, 3}});
  CHECK(broadcast.root == std::optional<int>(world - 1));
  CHECK_FALSE(broadcast.reduce_op.has_value());
  CHECK(broadcast.state == cpprun::CollectiveState::kCompleted);

  // A subgroup of the first and last rank: named under its parent, its members as global ranks.
  cpprun::ProcessGroup ends = cpprun::new_group(group(), {0, world - 1});
  if (ends.is_member()) {
    cpprun::barrier(ends);
    const cpprun::FlightRecorderEntry barrier = cpprun::flight_recorder_entries().back();
    CHECK(barrier.group.rfind("0/sub", 0) == 0);
    CHECK(barrier.group_ranks == std::vector<int>{0, world - 1});
    CHECK(barrier.seq == 1);
    CHECK(barrier.op == "barrier");
    CHECK_FALSE(barrier.dtype.has_value());
    CHECK(barrier.shapes.empty());
  }
  cpprun::barrier(group());
}
