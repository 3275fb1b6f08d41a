// FSDP's per-parameter sharding, in one process: the geometry of each rank's rows, and the
// copies between the unsharded and wire layouts (fsdp/fsdp_collectives.h, Note [Unsharded and
// wire layouts]) that surround the all-gather and the reduce-scatter, checked by simulating the
// collectives on every rank's buckets.
#include <ATen/ATen.h>
#include "catch.h"

#include <vector>

#include "fsdp/fsdp_collectives.h"
#include "fsdp/param_bucket.h"

namespace {

// Shapes no world size of 2-4 divides, a 0-d parameter, and one with fewer rows than ranks.
std::vector<at::Tensor> make_layout_params() {
  at::manual_seed(7);
  return {at::randn({11, 5}), at::randn({7}), at::randn({}), at::randn({2, 3, 2}), at::randn({13, 1})};
}

std::vector<cpprun::detail::ParamBucket> buckets_of_every_rank(int world, bool separate) {
  std::vector<cpprun::detail::ParamBucket> buckets;
  for (int rank = 0; rank < world; ++rank) {
    auto params = make_layout_params();
    std::vector<std::string> names;
    for (std::size_t i = 0; i < params.size(); ++i) names.push_back("p" + std::to_string(i));
    buckets.emplace_back(0, names, params, rank, world, std::nullopt, separate, false, /*keep_unsharded=*/true);
  }
  return buckets;
}

}  // namespace

TEST_CASE("fsdp layout: each rank holds rows [r*C, r*C + local) of every parameter, C = ceil(rows / world)",
          "[fsdp_layout]") {
  const auto full = make_layout_params();
  for (int world : {1, 2, 3, 4}) {
    for (bool separate : {false, true}) {
      INFO("world " << world << " separate shards " << separate);
      auto buckets = buckets_of_every_rank(world, separate);
      for (int rank = 0; rank < world; ++rank) {
        const auto& params = buckets[rank].params();
        int64_t rows_seen = 0;
        for (std::size_t i = 0; i < params.size(); ++i) {
          const auto& s = params[i];
          const at::Tensor rows = full[i].reshape({s.rows, s.row_numel});
          const int64_t first = std::min(rank * s.rows_per_rank, s.rows);
          CHECK(s.rows_per_rank == (s.rows + world - 1) / world);
          CHECK(s.shard.size(0) == s.local_rows);
          CHECK(s.shard.reshape({s.local_rows, s.row_numel}).equal(rows.narrow(0, first, s.local_rows)));
          CHECK(s.param.equal(full[i]));  // the module's parameter keeps its value, now in unsharded()
          rows_seen += s.local_rows;
        }
        CHECK(rows_seen > 0);
      }
      // Every row is held by exactly one rank.
      for (std::size_t i = 0; i < full.size(); ++i) {
        int64_t total = 0;
        for (int rank = 0; rank < world; ++rank) total += buckets[rank].params()[i].local_rows;
        CHECK(total == (full[i].dim() == 0 ? 1 : full[i].size(0)));
      }
    }
  }
}

TEST_CASE("fsdp layout: all-gathered chunks copy out into the unsharded parameters", "[fsdp_layout]") {
  const auto full = make_layout_params();
  // The ring copies each rank's chunk out as it arrives; the NCCL path copies every rank's out in
  // one batch (PieceCopies: one multi-tensor launch); a double wire (cast on the way) and a float one.
  for (int world : {1, 2, 3, 4}) for (bool one_batch : {false, true}) for (auto wire : {at::kFloat, at::kDouble}) {
    INFO("world " << world << " one batch " << one_batch << " wire " << wire);
    auto buckets = buckets_of_every_rank(world, /*separate=*/true);
    std::vector<at::Tensor> chunks;  // what an all-gather of every rank's shard_chunk receives
    for (const auto& bucket : buckets) chunks.push_back(cpprun::detail::shard_chunk(bucket, wire));
    const auto& bucket = buckets[world - 1];
    at::Tensor into = at::full({bucket.unsharded_numel()}, 42.0f);
    const cpprun::detail::ChunkedTensor places = cpprun::detail::unsharded_chunks(bucket, into);
    REQUIRE(places.chunks.size() == static_cast<std::size_t>(world));
    if (one_batch) {
      cpprun::detail::PieceCopies copies;
      for (int q = 0; q < world; ++q) cpprun::detail::unpack_chunk(chunks[q], places.chunks[q], copies);
      CHECK(into.eq(42.0f).all().item<bool>());  // nothing copied before run()
      copies.run();
    } else {
      for (int q = 0; q < world; ++q) cpprun::detail::unpack_chunk(chunks[q], places.chunks[q]);
    }
    for (std::size_t i = 0; i < full.size(); ++i) CHECK(bucket.param_view(into, i).equal(full[i]));
    // Padding rows come out as zeros.
    at::Tensor expected_padding = at::zeros({bucket.unsharded_numel()});
    for (std::size_t i = 0; i < full.size(); ++i) bucket.param_view(expected_padding, i).copy_(full[i]);
    CHECK(into.equal(expected_padding));
  }
}

TEST_CASE("fsdp layout: the gradients' chunks reduce-scatter into each rank's rows", "[fsdp_layout]") {
  // Packed chunk by chunk (the ring), or every rank's chunk in one batch (the NCCL path).
  for (int world : {1, 2, 3, 4}) for (bool one_batch : {false, true}) {
    INFO("world " << world << " one batch " << one_batch);
    auto buckets = buckets_of_every_rank(world, /*separate=*/false);
    std::vector<at::Tensor> grads;
    for (const auto& p : make_layout_params()) grads.push_back(at::randn_like(p));
    // Each rank's wire: the same gradients here, so a reduce-scatter's average is one rank's chunk.
    const auto& any = buckets[0];
    // What the ring reads for each rank's chunk: the real rows, padding as zeros.
    const cpprun::detail::ChunkedTensor pieces = cpprun::detail::gradient_chunks(any, grads);
    at::Tensor wire = at::full({any.unsharded_numel()}, 42.0f);
    cpprun::detail::PieceCopies copies;
    for (int q = 0; q < world; ++q) {
      const at::Tensor row = wire.narrow(0, q * any.chunk_numel(), any.chunk_numel());
      if (one_batch) cpprun::detail::pack_chunk(pieces.chunks[q], row, copies);
      else cpprun::detail::pack_chunk(pieces.chunks[q], row);
    }
    copies.run();
    CHECK_FALSE(wire.eq(42.0f).any().item<bool>());  // every element written: values or padding zeros
    for (int rank = 0; rank < world; ++rank) {
      auto& bucket = buckets[rank];
      const at::Tensor chunk = wire.narrow(0, rank * bucket.chunk_numel(), bucket.chunk_numel()).clone();
      cpprun::detail::accumulate_shard_grads_from_chunk(bucket, chunk);
      for (std::size_t i = 0; i < grads.size(); ++i) {
        const auto& s = bucket.params()[i];
        const int64_t first = std::min(rank * s.rows_per_rank, s.rows);
        CHECK(s.shard.grad().reshape({s.local_rows, s.row_numel}).equal(grads[i].reshape({s.rows, s.row_numel}).narrow(0, first, s.local_rows)));
      }
      // Stage 1's path: the same rows from a gradient laid out like unsharded().
      at::Tensor unsharded_grad = at::zeros({bucket.unsharded_numel()});
      for (std::size_t i = 0; i < grads.size(); ++i) bucket.param_view(unsharded_grad, i).copy_(grads[i]);
      CHECK(cpprun::detail::rank_chunk(bucket, unsharded_grad).equal(chunk));
    }
  }
}
