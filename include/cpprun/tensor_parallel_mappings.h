// Megatron's tensor-parallel "mappings": the differentiable collectives at the edges of a
// tensor-parallel region, each an autograd function over cpprun's collectives on the TP group.
// Layers (cpprun/tensor_parallel.h) are built from them; a model may call them directly to
// write its own tensor-parallel layer.
//
//   forward                              backward
//   copy_to_tensor_parallel_region       identity                 all-reduce (sum)
//   reduce_from_tensor_parallel_region   all-reduce (sum)         identity
//   scatter_to_tensor_parallel_region    keep my chunk of dim -1  all-gather along dim -1
//   gather_from_tensor_parallel_region   all-gather along dim -1  keep my chunk of dim -1
//   scatter_to_sequence_parallel_region  keep my chunk of `dim`   all-gather along `dim`
//   gather_from_sequence_parallel_region all-gather along `dim`   reduce-scatter along `dim`
//   reduce_scatter_to_sequence_parallel_region
//                                        reduce-scatter along `dim` all-gather along `dim`
//   sequence_parallel_column_linear      all-gather, linear       all-gather (again), reduce-scatter
//
// Chunks are in rank order (rank r of the group holds chunk r); a dimension that does not divide
// by the group's size is refused, naming the dimension, its size and the group's size. Every
// rank of the group must call the same mappings in the same order (each is a collective, in
// forward or in backward). With a group of one each is the identity.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "cpprun/process_group.h"

namespace cpprun {

at::Tensor copy_to_tensor_parallel_region(const at::Tensor& input, const ProcessGroup& group);
at::Tensor reduce_from_tensor_parallel_region(const at::Tensor& input, const ProcessGroup& group);
at::Tensor scatter_to_tensor_parallel_region(const at::Tensor& input, const ProcessGroup& group);
at::Tensor gather_from_tensor_parallel_region(const at::Tensor& input, const ProcessGroup& group);

// Sequence parallelism: `dim` is the sequence dimension (0 in Megatron's [s, b, h]; 1 in
// PyTorch's [b, s, h]; negative counts from the end).
at::Tensor scatter_to_sequence_parallel_region(const at::Tensor& input, const ProcessGroup& group, int64_t dim);
at::Tensor gather_from_sequence_parallel_region(const at::Tensor& input, const ProcessGroup& group, int64_t dim);
at::Tensor reduce_scatter_to_sequence_parallel_region(const at::Tensor& input, const ProcessGroup& group,
                                                      int64_t dim);

// A column-parallel linear on sequence shards, as one autograd function (Megatron-LM's
// linear_with_grad_accumulation_and_async_allreduce with sequence_parallel): forward all-gathers
// `input_shard` along `dim` and returns linear(gathered, weight, bias) (weight: this rank's rows);
// backward reduce-scatters the input's gradient along `dim` and, for the weight's gradient,
// all-gathers the input again. Autograd keeps only the shard, 1/t of what
// linear(gather_from_sequence_parallel_region(x), weight, bias) keeps, for one more all-gather.
// `bias` may be undefined.
at::Tensor sequence_parallel_column_linear(const at::Tensor& input_shard, const at::Tensor& weight,
                                           const at::Tensor& bias, const ProcessGroup& group, int64_t dim);

}  // namespace cpprun
