// Plain (non-differentiable) tensor shapes over comm/'s collectives that the TP mappings and
// layers share: a sum all-reduce into a new tensor, and split / all-gather / reduce-scatter
// along one dimension in rank order. `what` names the caller in errors.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "cpprun/process_group.h"

namespace cpprun::tp {

// A new contiguous tensor holding the sum over the group of `input` (which is unchanged).
at::Tensor all_reduce_sum(const at::Tensor& input, const ProcessGroup& group);
// A new tensor holding the element-wise maximum over the group (the vocab-parallel loss).
at::Tensor all_reduce_max(const at::Tensor& input, const ProcessGroup& group);
// This rank's chunk (a copy) of `input` split into group.size() equal parts along `dim`.
at::Tensor chunk_along(const at::Tensor& input, const ProcessGroup& group, int64_t dim, const char* what);
// The ranks' `input`s concatenated along `dim` in rank order.
at::Tensor all_gather_along(const at::Tensor& input, const ProcessGroup& group, int64_t dim, const char* what);
// Chunk r (along `dim`) of the sum over ranks of `input`, on rank r.
at::Tensor reduce_scatter_along(const at::Tensor& input, const ProcessGroup& group, int64_t dim, const char* what);

// Refuses a size that does not divide by the TP group's size, naming `what`, the dimension, the
// shape and the group's size.
void check_divides(const at::Tensor& input, int64_t dim, int world, const char* what);

}  // namespace cpprun::tp
