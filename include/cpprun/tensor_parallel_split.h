// What a tensor-parallel module tells the rest of cpprun about its parameters: which of them are
// split across its tensor-parallel group, and along which dimension. DistributedDataParallel and
// FullyShardedDataParallel read it to clip gradients by the norm of the whole model (a split
// gradient's squares are summed over the TP group, a whole one counted once) and to refuse a
// data-parallel group that would mix different shards; tensor_parallel_full_state_dict reads it to
// gather each shard back. The layers of cpprun/tensor_parallel.h implement it; so does a layer
// of your own written with the mappings (cpprun/tensor_parallel_mappings.h), e.g. an attention
// block whose fused query/key/value projection is split by heads:
//
//   struct MyAttentionImpl : torch::nn::Module, cpprun::TensorParallelModule {
//     std::map<std::string, cpprun::TensorParallelSplit> tensor_parallel_splits() const override {
//       return {{"qkv_weight", {group, /*dim=*/0, /*parts=*/3}}, {"proj_weight", {group, 1}}};
//     }
//     ...
//   };
#pragma once

#include <torch/nn/module.h>

#include <cstdint>
#include <map>
#include <string>

#include "cpprun/process_group.h"

namespace cpprun {

// A parameter split across `group`: rank r holds chunk r of `dim`. A fused parameter is `parts`
// equal blocks stacked along `dim` (a query/key/value projection [q; k; v]) split block by block:
// rank r holds chunk r of each block, concatenated (its heads' q, k and v). The whole tensor is
// `parts` * group.size() chunks; gathering puts every block's chunks back in rank order.
struct TensorParallelSplit {
  ProcessGroup group;
  int64_t dim = 0;
  int64_t parts = 1;
};

// Implemented by modules holding tensor-parallel shards. The parameters a module does not list
// are whole on every rank of its group, with equal gradients there (a row-parallel layer's bias,
// a sequence-parallel LayerNorm's weight, whose gradients the mappings already sum).
class TensorParallelModule {
 public:
  // Forgets the split parameters noted for cpprun::clip_grad_norm_ given a parameter list.
  virtual ~TensorParallelModule();
  // This module's own split parameters, by their name in it ("weight"; not its children's).
  virtual std::map<std::string, TensorParallelSplit> tensor_parallel_splits() const = 0;
};

// Every split parameter of `module` and its submodules, by dotted name as named_parameters()
// gives it ("0.weight", "h.3.attn.c_attn.weight"). Empty for a model without tensor parallelism.
std::map<std::string, TensorParallelSplit> tensor_parallel_splits(torch::nn::Module& module);

}  // namespace cpprun
