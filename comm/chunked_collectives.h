// All-gather and reduce-scatter of a tensor that exists only as pieces (comm/ring.h's
// ChunkedTensor): FSDP's unit of parameters, each in its own place, moved by one collective.
// Over Gloo our ring copies each chunk straight between the pieces and the wire as it passes,
// so no tensor of the whole size is made and the copies overlap the transfers; over NCCL the
// chunks are packed into one tensor around NCCL's own collective. Recorded and checked as
// all_gather_into and reduce_scatter of the whole size.
#pragma once

#include <ATen/core/Tensor.h>

#include "comm/ring.h"
#include "cpprun/collectives.h"

namespace cpprun::detail {

// Every rank's chunk output.chunks[rank], which the caller has filled, into that chunk on every
// other rank: an all-gather in place, carrying `wire`'s dtype (pieces of another are cast), with
// one chunk per rank of the group.
Work all_gather_chunks_in_place_async(const ProcessGroup& group, ChunkedTensor output, at::TensorOptions wire);

// `output` (input.chunk_numel elements) becomes the reduction over the group of every rank's
// chunk `rank` of `input` (read in output's dtype; padding counts as zeros).
Work reduce_scatter_chunks_async(const ProcessGroup& group, at::Tensor output, ChunkedTensor input, ReduceOp op);

}  // namespace cpprun::detail
