// Tensor parallelism (Megatron-LM's column- and row-parallel layers) on an existing
// torch::nn::Module, with a plan as torch.distributed.tensor.parallel.parallelize_module takes:
//
//   auto mlp = torch::nn::Sequential(torch::nn::Linear(512, 2048), torch::nn::Functional(gelu),
//                                    torch::nn::Linear(2048, 512));
//   cpprun::parallelize_module(mlp.ptr(), tp_group,   // or (mesh, "tp")
//       {{"0", cpprun::ColwiseParallel()}, {"2", cpprun::RowwiseParallel()}});
//   // each rank now holds 2048/tp of fc1's rows and fc2's columns; mlp->forward(x) is the whole MLP
//
// The communication is Megatron's (cpprun/tensor_parallel_mappings.h): per MLP, one all-reduce in
// forward (after the row-parallel layer) and one in backward (into the column-parallel layer's
// input gradient). See docs/tensor_parallel.md.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>
#include <torch/ordered_dict.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cpprun/device_mesh.h"
#include "cpprun/process_group.h"
#include "cpprun/tensor_parallel_mappings.h"
#include "cpprun/tensor_parallel_split.h"
#include "cpprun/tensor_parallel_styles.h"

namespace cpprun {

// Submodule name (dotted, as named_modules() gives it: "block.mlp.fc1"; "0" for a Sequential's
// first entry) -> how to split it. Each dotted part may be an fnmatch pattern, as in PyTorch
// ("layers.*.mlp.fc1": every block's fc1); one that matches nothing is refused.
using ParallelizePlan = std::vector<std::pair<std::string, ParallelStyle>>;

// Note [Replacing submodules]: each planned submodule (a torch::nn::Linear or Embedding) is
// replaced, in its parent's registry and in Sequential / ModuleList / ModuleDict entries, by the
// tensor-parallel module below, holding this rank's shard of its parameters under the same names
// ("fc1.weight" is now fc1's rows for this rank). The full parameters are first broadcast from
// the group's rank 0 (as PyTorch's src_data_rank=0), so ranks that initialised differently still
// agree. A parent whose forward() calls a child through its own member (`fc1(x)` where
// `torch::nn::Linear fc1`) still calls the old, whole module: C++ cannot re-point that member.
// Call the child through the registry (a Sequential, or named_children()["fc1"]) or declare
// the member as the tensor-parallel type and build it with that type directly.
// A dimension that does not divide by the group's size is refused, naming the submodule, the
// dimension and the sizes (no padding: a padded shard changes the model's shape and its state
// dict). Collective over `tp_group`: every rank calls it with the same plan. Returns `module`.
std::shared_ptr<torch::nn::Module> parallelize_module(std::shared_ptr<torch::nn::Module> module,
                                                      const ProcessGroup& tp_group, const ParallelizePlan& plan);
std::shared_ptr<torch::nn::Module> parallelize_module(std::shared_ptr<torch::nn::Module> module,
                                                      const DeviceMesh& mesh, const std::string& tp_dim,
                                                      const ParallelizePlan& plan);

// ---- the tensor-parallel modules parallelize_module puts in place (usable directly, too) ----

// A Linear whose output features are split: weight [out/tp, in], bias [out/tp].
class ColwiseParallelLinearImpl : public torch::nn::Module, public TensorParallelModule {
 public:
  // Takes this rank's rows of `full`'s weight and bias (copies; `full` is unchanged).
  ColwiseParallelLinearImpl(const torch::nn::LinearImpl& full, ProcessGroup group, ColwiseParallel style = {});
  at::Tensor forward(const at::Tensor& input);
  void pretty_print(std::ostream& stream) const override;
  std::map<std::string, TensorParallelSplit> tensor_parallel_splits() const override;
  const ProcessGroup& process_group() const { return group_; }
  const ColwiseParallel& style() const { return style_; }

  at::Tensor weight, bias;  // bias undefined when the Linear had none
  int64_t in_features, out_features;  // of the whole layer

 private:
  ProcessGroup group_;
  ColwiseParallel style_;
};
TORCH_MODULE(ColwiseParallelLinear);

// A Linear whose input features are split: weight [out, in/tp]; bias [out], whole.
class RowwiseParallelLinearImpl : public torch::nn::Module, public TensorParallelModule {
 public:
  RowwiseParallelLinearImpl(const torch::nn::LinearImpl& full, ProcessGroup group, RowwiseParallel style = {});
  at::Tensor forward(const at::Tensor& input);
  void pretty_print(std::ostream& stream) const override;
  std::map<std::string, TensorParallelSplit> tensor_parallel_splits() const override;
  const ProcessGroup& process_group() const { return group_; }
  const RowwiseParallel& style() const { return style_; }

  at::Tensor weight, bias;
  int64_t in_features, out_features;

 private:
  ProcessGroup group_;
  RowwiseParallel style_;
};
TORCH_MODULE(RowwiseParallelLinear);

// An Embedding whose vocabulary is split (Megatron's VocabParallelEmbedding; PyTorch's
// RowwiseParallel on nn.Embedding): weight [num_embeddings/tp, dim], rank r holding ids
// [r * num_embeddings/tp, (r+1) * num_embeddings/tp). Ids outside that range look up zeros; the
// output is all-reduced (or reduce-scattered, output_layouts Shard(d)). Ids given as Shard(d)
// (the style's default) are all-gathered along d first, as PyTorch's. Embeddings with
// padding_idx, max_norm or sparse gradients are refused.
class VocabParallelEmbeddingImpl : public torch::nn::Module, public TensorParallelModule {
 public:
  // Built directly, it takes the same whole ids on every rank (Megatron's class); under
  // parallelize_module, the plan's style says (PyTorch's default: Shard(-1) ids, all-gathered).
  VocabParallelEmbeddingImpl(const torch::nn::EmbeddingImpl& full, ProcessGroup group,
                             RowwiseParallel style = RowwiseParallel().input_layouts(Replicate()));
  at::Tensor forward(const at::Tensor& ids);
  void pretty_print(std::ostream& stream) const override;
  std::map<std::string, TensorParallelSplit> tensor_parallel_splits() const override;
  const ProcessGroup& process_group() const { return group_; }
  int64_t vocab_start() const { return vocab_start_; }  // the first id this rank holds

  at::Tensor weight;
  int64_t num_embeddings, embedding_dim;  // of the whole table

 private:
  ProcessGroup group_;
  RowwiseParallel style_;
  int64_t vocab_start_;
};
TORCH_MODULE(VocabParallelEmbedding);

// An Embedding whose embedding dimension is split (PyTorch's ColwiseParallel on nn.Embedding):
// weight [num_embeddings, dim/tp], every rank holding every id's columns r·dim/tp onwards. The ids
// are whole on every rank; the output is this rank's columns (Shard(-1), the default) or
// all-gathered (Replicate()). No communication in forward with Shard(-1), and none in backward.
// Embeddings with padding_idx, max_norm or sparse gradients are refused.
class ColwiseParallelEmbeddingImpl : public torch::nn::Module, public TensorParallelModule {
 public:
  ColwiseParallelEmbeddingImpl(const torch::nn::EmbeddingImpl& full, ProcessGroup group, ColwiseParallel style = {});
  at::Tensor forward(const at::Tensor& ids);
  void pretty_print(std::ostream& stream) const override;
  std::map<std::string, TensorParallelSplit> tensor_parallel_splits() const override;
  const ProcessGroup& process_group() const { return group_; }

  at::Tensor weight;
  int64_t num_embeddings, embedding_dim;  // of the whole table

 private:
  ProcessGroup group_;
  ColwiseParallel style_;
};
TORCH_MODULE(ColwiseParallelEmbedding);

// A LayerNorm on sequence shards (SequenceParallel): its input and output are this rank's slice
// of the sequence; weight and bias are whole on every rank, and their gradients (each rank's
// covering its own tokens) are all-reduced over the group in backward (a copy_to region around
// each). Put it between a RowwiseParallel with output_layouts Shard(d) and a ColwiseParallel
// with input_layouts Shard(d), d = style.sequence_dim().
class SequenceParallelLayerNormImpl : public torch::nn::Module, public TensorParallelModule {
 public:
  SequenceParallelLayerNormImpl(const torch::nn::LayerNormImpl& full, ProcessGroup group, SequenceParallel style = {});
  at::Tensor forward(const at::Tensor& input);
  void pretty_print(std::ostream& stream) const override;
  std::map<std::string, TensorParallelSplit> tensor_parallel_splits() const override;
  const ProcessGroup& process_group() const { return group_; }

  at::Tensor weight, bias;  // undefined without elementwise_affine
  std::vector<int64_t> normalized_shape;
  double eps;

 private:
  ProcessGroup group_;
  SequenceParallel style_;
};
TORCH_MODULE(SequenceParallelLayerNorm);

// Dropout on sequence shards (SequenceParallel on a torch::nn::Dropout), by the rule of
// tensor_parallel_dropout below: this rank's slice of the mask the whole sequence would get.
class SequenceParallelDropoutImpl : public torch::nn::Module, public TensorParallelModule {
 public:
  SequenceParallelDropoutImpl(const torch::nn::DropoutImpl& full, ProcessGroup group, SequenceParallel style = {});
  at::Tensor forward(const at::Tensor& input);
  void pretty_print(std::ostream& stream) const override;
  std::map<std::string, TensorParallelSplit> tensor_parallel_splits() const override { return {}; }
  const ProcessGroup& process_group() const { return group_; }

  double p;

 private:
  ProcessGroup group_;
  SequenceParallel style_;
};
TORCH_MODULE(SequenceParallelDropout);

// Note [Dropout's RNG rule]: dropout on an activation split across the group along `dim` (a
// sequence shard, or the features between a column- and a row-parallel layer) draws the mask of
// the whole activation from this rank's default generator and applies this rank's chunk of it, as
// DTensor's random ops do. With the generators seeded alike across the tensor-parallel group (as
// torch::manual_seed(seed) on every rank does), the ranks' masks are the slices of one mask:
// different where their elements differ, and training equals one process's with the same seed
// (on CPU, where at::dropout draws bernoulli_ over the whole tensor). Dropout on a replicated
// activation needs nothing: a plain Dropout draws the same mask on every rank. The generators
// stay in step because every rank draws the same amount. The price: t times the random numbers
// of the rank's own elements. Identity when !train or p == 0.
at::Tensor tensor_parallel_dropout(const at::Tensor& input, double p, bool train, const ProcessGroup& group,
                                   int64_t dim);

// ---- checkpoints ----

// The module's state dict with every tensor-parallel shard gathered back to the whole tensor under
// its unsplit name ("fc1.weight" [out, in] again): what the same module had before
// parallelize_module, so it loads into an unsplit model (load_state_dict by name, or
// copy_ into its named_parameters()). In Python's state_dict() order: each module's parameters,
// its buffers, then its children's. Collective over each tensor-parallel module's group: every rank calls it;
// every rank gets the whole dict.
torch::OrderedDict<std::string, at::Tensor> tensor_parallel_full_state_dict(torch::nn::Module& module);

// ---- vocabulary-parallel output layer and loss ----

// The logits of an output layer tied to a vocabulary-parallel embedding (Megatron's
// parallel_lm_logits with the word embeddings' weight): hidden [..., H], whole on every rank ->
// this rank's columns of the logits [..., V/tp] (split along the vocabulary, as
// vocab_parallel_cross_entropy takes them), hidden · weightᵀ with the embedding's own shard, so
// the embedding and the head stay one tensor and its gradient sums both uses. `hidden_layout`:
// Replicate() (hidden whole on every rank; it enters through copy_to_tensor_parallel_region, its
// gradient all-reduced in backward) or Shard(d) under sequence parallelism (hidden is this rank's
// shard of the sequence dimension d, all-gathered here as a ColwiseParallel's input is, its
// gradient reduce-scattered; the logits cover the whole sequence).
at::Tensor vocab_parallel_logits(const at::Tensor& hidden, const VocabParallelEmbeddingImpl& embedding,
                                 Placement hidden_layout = Replicate());


// Cross-entropy of logits split along the vocabulary (the last dim: rank r holds classes
// [r * V/tp, (r+1) * V/tp), as a ColwiseParallel output head gives them) without gathering them:
// the row maximum, the sum of exponentials and the target's logit are each all-reduced (three
// all-reduces of one value per row; Megatron's vocab_parallel_cross_entropy, PyTorch's
// loss_parallel). logits: [..., V/tp]; target: [...], ids in [0, V) or `ignore_index` (as
// cross_entropy's, default -100: padding), whose rows get loss 0 and gradient 0. Returns the
// per-token loss [...], the same on every rank: cross_entropy's default mean is
// loss.sum() / (target != ignore_index).sum() (.mean() when nothing is ignored). The backward needs
// no communication: softmax minus the one-hot target, on this rank's columns.
at::Tensor vocab_parallel_cross_entropy(const at::Tensor& logits, const at::Tensor& target, const ProcessGroup& group,
                                        int64_t ignore_index = -100);

}  // namespace cpprun
