// How parallelize_module (cpprun/tensor_parallel.h) splits one submodule, named as in
// torch.distributed.tensor.parallel: ColwiseParallel, RowwiseParallel, SequenceParallel, with
// input and output layouts given as placements, Replicate() or Shard(dim).
//
//   cpprun::ColwiseParallel()                                 // output stays split on the last dim
//   cpprun::ColwiseParallel().output_layouts(cpprun::Replicate())   // all-gathered output
//   cpprun::RowwiseParallel().input_layouts(cpprun::Replicate())    // input split here first
//   cpprun::RowwiseParallel().output_layouts(cpprun::Shard(1))      // sequence parallel: reduce-scatter
#pragma once

#include <torch/arg.h>

#include <cstdint>
#include <string>
#include <variant>

namespace cpprun {

// Where a tensor lives across the tensor-parallel group: whole on every rank, or split into
// equal chunks along one dimension (chunk r on rank r), as DTensor's placements.
struct Placement {
  enum class Kind { kReplicate, kShard };
  Kind kind = Kind::kReplicate;
  int64_t dim = 0;  // kShard only; negative counts from the end
  bool is_replicate() const { return kind == Kind::kReplicate; }
  bool is_shard() const { return kind == Kind::kShard; }
  std::string str() const;  // "Replicate()" or "Shard(1)"
};
inline Placement Replicate() { return {Placement::Kind::kReplicate, 0}; }
inline Placement Shard(int64_t dim) { return {Placement::Kind::kShard, dim}; }

// Linear: the output features are split (weight rows, bias). Input: Replicate() (its backward
// all-reduces the input's gradient) or Shard(d) (sequence parallel: all-gathered along d, its
// gradient reduce-scattered). Output: Shard(-1) (kept split) or Replicate() (all-gathered).
// Embedding: the embedding dimension is split (weight columns); input Replicate() (the ids),
// output Shard(-1) or Replicate().
struct ColwiseParallel {
  TORCH_ARG(Placement, input_layouts) = Replicate();
  TORCH_ARG(Placement, output_layouts) = Shard(-1);
  // Sequence parallel input only. false (the default, as Megatron-LM): backward keeps only this
  // rank's sequence shard of the input and all-gathers it again to compute the weight's gradient,
  // so the layer's saved activation falls by the TP degree. true (as PyTorch's DTensor): it
  // keeps the all-gathered input, t times larger, and saves that all-gather.
  TORCH_ARG(bool, keep_gathered_input) = false;
};

// Linear: the input features are split (weight columns); the bias stays whole and is added once
// after the reduction. Input: Shard(-1) (already split, e.g. a ColwiseParallel's output) or
// Replicate() (split here). Output: Replicate() (all-reduced) or Shard(d) (reduce-scattered
// along d: the sequence for sequence parallelism, or the features, each rank adding its chunk of
// the bias).
// Embedding: the vocabulary is split (rows of the weight; Megatron's VocabParallelEmbedding):
// ids outside this rank's rows give zeros, and the output is all-reduced (Replicate()) or
// reduce-scattered along d (Shard(d)). The ids, as PyTorch reads them: Replicate() (the same ids
// on every rank: the usual plan, which must say so) or Shard(d) (each rank's chunk along d,
// all-gathered first; the default Shard(-1) means this).
struct RowwiseParallel {
  TORCH_ARG(Placement, input_layouts) = Shard(-1);
  TORCH_ARG(Placement, output_layouts) = Replicate();
};

// A LayerNorm run on sequence shards, its parameters whole on every rank: its input and output
// are Shard(sequence_dim) (dim 1 of [batch, sequence, hidden], as PyTorch's default); the
// parameters' gradients, partial on each rank, are all-reduced over the group in backward.
// A Dropout run on sequence shards: each rank applies its slice of the mask the whole sequence
// would get (Note [Dropout's RNG rule] in tensor_parallel.h), so masks differ across ranks as
// their tokens do, and training matches one process. Other parameter-free modules between the
// boundaries (GELU) need no plan entry: they run on the shard as they are.
struct SequenceParallel {
  TORCH_ARG(int64_t, sequence_dim) = 1;
};

using ParallelStyle = std::variant<ColwiseParallel, RowwiseParallel, SequenceParallel>;
const char* style_name(const ParallelStyle& style);

}  // namespace cpprun
