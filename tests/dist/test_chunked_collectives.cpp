// All-gather and reduce-scatter of tensors that exist only as pieces (comm/chunked_collectives.h),
// as FSDP moves a unit of parameters: each chunk as several messages, some one piece (moved with
// no copy), some several small pieces (staged), some partly padding, some pieces of another dtype.
// Every rank checks its result against values computed locally; run under cpprun at 1-4 ranks.
#include "catch.h"
#include <ATen/ATen.h>

#include <utility>
#include <vector>

#include "comm/chunked_collectives.h"
#include "comm/group_impl.h"  // p2p_bytes_sent
#include "comm/ring.h"
#include "dist_test_support.h"

using cpprun::detail::ChunkedTensor;
using cpprun::detail::ChunkPiece;
using dist_test::group;

namespace {

// One "parameter" of the layout: `extent` elements of every chunk, of which the first `real` are
// a piece (the rest padding), in `dtype`. Big ones travel alone; the small ones are grouped.
struct Extent {
  int64_t extent;
  int64_t real;
  at::ScalarType dtype;
};
const std::vector<Extent> kLayout = {
    {70000, 70000, at::kFloat},     // 280 KB: a message of its own, moved with no copy
    {5, 5, at::kFloat},             // small ones, grouped into one staged message
    {300, 290, at::kFloat},         // ... with padding at its end
    {17, 17, at::kBFloat16},        // ... and a piece of another dtype
    {65537, 65000, at::kFloat},     // a message of its own, partly padding: staged
    {65536, 65536, at::kBFloat16},  // a message of its own, of another dtype: staged
    {9, 9, at::kFloat},             // a small one after a big one: a message of its own
};

int64_t chunk_numel() {
  int64_t m = 0;
  for (const Extent& e : kLayout) m += e.extent;
  return m;
}

// Chunk q's value at element i (whole chunk, padding included): small integers, exact in bf16.
at::Tensor chunk_values(int q, int64_t m) { return ((at::arange(m, at::kLong) % 7 + 1) * (q + 1)).to(at::kFloat); }

// Each chunk's pieces, as separate tensors (the "parameters' rows"), and where they sit.
struct Layout {
  ChunkedTensor chunked;
  std::vector<int64_t> extent_offsets;
};

Layout make_layout(int world, bool leave_out_third = false) {
  Layout layout;
  layout.chunked.chunk_numel = chunk_numel();
  layout.chunked.chunks.resize(world);
  std::vector<std::pair<int64_t, int64_t>> extents;
  int64_t offset = 0;
  for (const Extent& e : kLayout) {
    extents.emplace_back(offset, e.extent);
    layout.extent_offsets.push_back(offset);
    offset += e.extent;
  }
  layout.chunked.message_starts = cpprun::detail::message_starts_for(extents, sizeof(float));
  for (int q = 0; q < world; ++q) {
    for (std::size_t i = 0; i < kLayout.size(); ++i) {
      if (leave_out_third && i == 2) continue;  // as a parameter with no gradient: zeros
      layout.chunked.chunks[q].push_back({layout.extent_offsets[i], at::full({kLayout[i].real}, -1.0, kLayout[i].dtype)});
    }
  }
  return layout;
}

// What chunk q holds once padding and pieces are accounted for: the values where there is a
// piece (as its dtype rounds them), zero where there is none.
at::Tensor expected_chunk(const at::Tensor& values, const Layout& layout, bool leave_out_third = false) {
  at::Tensor expected = at::zeros_like(values);
  for (std::size_t i = 0; i < kLayout.size(); ++i) {
    if (leave_out_third && i == 2) continue;
    auto place = expected.narrow(0, layout.extent_offsets[i], kLayout[i].real);
    place.copy_(values.narrow(0, layout.extent_offsets[i], kLayout[i].real).to(kLayout[i].dtype));
  }
  return expected;
}

at::Tensor gathered_chunk(const std::vector<ChunkPiece>& pieces, int64_t m) {
  at::Tensor chunk = at::zeros({m});
  for (const ChunkPiece& piece : pieces) chunk.narrow(0, piece.offset, piece.values.numel()).copy_(piece.values);
  return chunk;
}

}  // namespace

TEST_CASE("chunked collectives: message starts give big extents a message each and group small ones", "[chunked]") {
  using cpprun::detail::message_starts_for;
  // Extents of 4-byte elements; messages of at least 1000 bytes stand alone.
  CHECK(message_starts_for({{0, 500}, {500, 10}, {510, 10}, {520, 300}, {820, 1}}, 4, 1000) ==
        std::vector<int64_t>{0, 500, 520, 820});
  // Grouping closes once a group reaches the size.
  CHECK(message_starts_for({{0, 100}, {100, 200}, {300, 100}, {400, 100}}, 4, 1000) == std::vector<int64_t>{0, 300});
  // Empty extents are skipped; whatever precedes the first one travels with it.
  CHECK(message_starts_for({{0, 0}, {3, 600}}, 4, 1000) == std::vector<int64_t>{0});
  CHECK(message_starts_for({}, 4, 1000).empty());
  // The layout the tests below use: four messages, two of them staged.
  std::vector<std::pair<int64_t, int64_t>> extents;
  int64_t offset = 0;
  for (const Extent& e : kLayout) {
    extents.emplace_back(offset, e.extent);
    offset += e.extent;
  }
  CHECK(message_starts_for(extents, 4).size() == 5);
}

TEST_CASE("chunked collectives: all-gather in place fills every rank's chunk, pieces of any dtype", "[chunked]") {
  const int world = group().size(), rank = group().rank();
  Layout layout = make_layout(world);
  const int64_t m = layout.chunked.chunk_numel;
  // This rank's contribution in its own chunk's pieces; the others hold -1 until they arrive.
  const at::Tensor mine = chunk_values(rank, m);
  for (ChunkPiece& piece : layout.chunked.chunks[rank]) {
    piece.values.copy_(mine.narrow(0, piece.offset, piece.values.numel()));
  }
  const uint64_t before = cpprun::detail::impl_of(group()).p2p_bytes_sent;
  cpprun::detail::all_gather_chunks_in_place_async(group(), layout.chunked, at::TensorOptions(at::kFloat)).wait();
  const uint64_t sent = cpprun::detail::impl_of(group()).p2p_bytes_sent - before;
  for (int q = 0; q < world; ++q) {
    INFO("chunk " << q << " on rank " << rank);
    CHECK(gathered_chunk(layout.chunked.chunks[q], m).equal(expected_chunk(chunk_values(q, m), layout)));
  }
  // The wire carries each other rank's whole chunk once, padding included: as a flat all-gather.
  CHECK(sent == static_cast<uint64_t>(world - 1) * m * sizeof(float));
}

TEST_CASE("chunked collectives: reduce-scatter of pieces, padding and missing pieces as zeros", "[chunked]") {
  const int world = group().size(), rank = group().rank();
  // Scratch pieces (FSDP's gradients) hold the partials between steps: the same result.
  for (int variant = 0; variant < 4; ++variant) {
    const bool leave_out_third = variant % 2 == 1, scratch = variant >= 2;
    // Odd ranks lack the third piece (as a parameter that got no gradient there).
    const bool lacking = leave_out_third && rank % 2 == 1;
    Layout layout = make_layout(world, lacking);
    layout.chunked.pieces_are_scratch = scratch;
    const int64_t m = layout.chunked.chunk_numel;
    for (int q = 0; q < world; ++q) {
      const at::Tensor values = chunk_values(q, m) * (rank + 1);
      for (ChunkPiece& piece : layout.chunked.chunks[q]) {
        piece.values.copy_(values.narrow(0, piece.offset, piece.values.numel()));
      }
    }
    at::Tensor output = at::full({m}, 42.0f);
    cpprun::detail::reduce_scatter_chunks_async(group(), output, layout.chunked, cpprun::ReduceOp::kSum).wait();
    // Sum over ranks r of (r+1) * chunk_values(rank), where each rank has a piece.
    at::Tensor expected = at::zeros({m});
    const Layout full = make_layout(world);
    for (int r = 0; r < world; ++r) {
      const bool r_lacks = leave_out_third && r % 2 == 1;
      expected += expected_chunk(chunk_values(rank, m), full, r_lacks) * (r + 1);
    }
    INFO("rank " << rank << (leave_out_third ? ", odd ranks lacking a piece" : "") << (scratch ? ", scratch pieces" : ""));
    CHECK(output.equal(expected));
  }
}
