// The tensor-parallel Linear and Embedding modules (cpprun/tensor_parallel.h): this rank's shard
// of the parameters, and the forward that wraps the local op in Megatron's mappings.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <ostream>

#include "comm/group_membership.h"
#include "core/split_parameter_registry.h"
#include "cpprun/tensor_parallel.h"
#include "tp/parallel_layer_checks.h"
#include "tp/tp_collectives.h"

namespace cpprun {
namespace {

// This rank's chunk of `full` along `dim`, a fresh tensor that requires grad as `full` does.
at::Tensor shard_of(const at::Tensor& full, const ProcessGroup& group, int64_t dim, const char* what) {
  TORCH_CHECK(full.size(dim) % group.size() == 0, "cpprun::", what, ": dimension ", dim, " of the weight (shape ",
              full.sizes(), ") has size ", full.size(dim), ", which does not divide by the tensor-parallel group's "
              "size ", group.size(), ".");
  at::NoGradGuard no_grad;
  return full.detach().chunk(group.size(), dim)[group.rank()].clone(at::MemoryFormat::Contiguous);
}

// Only the group's ranks hold a shard (on a non-member, size() and rank() are -1).
void check_member(const ProcessGroup& group, const char* what) { detail::check_member(what, group); }

void refuse_embedding_options(const torch::nn::EmbeddingOptions& o, const char* style) {
  TORCH_CHECK(!o.padding_idx() && !o.max_norm() && !o.scale_grad_by_freq() && !o.sparse(), "cpprun::", style,
              ": the Embedding has padding_idx, max_norm, scale_grad_by_freq or sparse set; the split embedding "
              "supports none of them yet.");
}

}  // namespace

namespace detail {

void check_colwise_linear(const ColwiseParallel& style) {
  const Placement in = style.input_layouts(), out = style.output_layouts();
  TORCH_CHECK(in.is_replicate() || (in.dim != -1 && in.dim >= 0),
              "cpprun::ColwiseParallel: input_layouts ", in.str(), " is not supported for a Linear: use "
              "Replicate() or Shard(d) with d the sequence dimension (>= 0; the input's features are whole).");
  TORCH_CHECK(out.is_replicate() || out.dim == -1, "cpprun::ColwiseParallel: output_layouts ", out.str(),
              " is not supported: use Shard(-1) (the output features stay split) or Replicate().");
}

void check_rowwise_linear(const RowwiseParallel& style) {
  const Placement in = style.input_layouts();
  TORCH_CHECK(in.is_replicate() || in.dim == -1, "cpprun::RowwiseParallel: input_layouts ", in.str(),
              " is not supported for a Linear: use Shard(-1) (the input features arrive split, e.g. from a "
              "ColwiseParallel) or Replicate() (split here).");
}

void check_vocab_parallel_embedding(const torch::nn::EmbeddingOptions& options, const RowwiseParallel& style) {
  refuse_embedding_options(options, "RowwiseParallel");
  const Placement out = style.output_layouts();
  TORCH_CHECK(out.is_replicate() || out.dim >= 0, "cpprun::RowwiseParallel: output_layouts ", out.str(),
              " is not supported for an Embedding: use Replicate() or Shard(d) with d the sequence dimension.");
}

void check_colwise_embedding(const torch::nn::EmbeddingOptions& options, const ColwiseParallel& style) {
  refuse_embedding_options(options, "ColwiseParallel");
  TORCH_CHECK(style.input_layouts().is_replicate(), "cpprun::ColwiseParallel: input_layouts ",
              style.input_layouts().str(), " is not supported for an Embedding: its input (the token ids) is "
              "Replicate() on every rank.");
  const Placement out = style.output_layouts();
  TORCH_CHECK(out.is_replicate() || out.dim == -1, "cpprun::ColwiseParallel: output_layouts ", out.str(),
              " is not supported for an Embedding: use Shard(-1) (the embedding dimension stays split) or "
              "Replicate().");
}

}  // namespace detail

ColwiseParallelLinearImpl::ColwiseParallelLinearImpl(const torch::nn::LinearImpl& full, ProcessGroup group,
                                                     ColwiseParallel style)
    : in_features(full.options.in_features()), out_features(full.options.out_features()),
      group_(std::move(group)), style_(style) {
  check_member(group_, "ColwiseParallelLinear");
  detail::check_colwise_linear(style_);
  weight = register_parameter("weight", shard_of(full.weight, group_, 0, "ColwiseParallel"),
                              full.weight.requires_grad());
  if (full.bias.defined()) {
    bias = register_parameter("bias", shard_of(full.bias, group_, 0, "ColwiseParallel"), full.bias.requires_grad());
  }
  detail::register_split_parameters(*this, *this);  // Note [Split parameters in a parameter list]
}

at::Tensor ColwiseParallelLinearImpl::forward(const at::Tensor& input) {
  const Placement in = style_.input_layouts();
  at::Tensor y;
  if (in.is_shard() && !style_.keep_gathered_input()) {
    y = sequence_parallel_column_linear(input, weight, bias, group_, in.dim);  // keeps only the shard
  } else {
    at::Tensor x = in.is_shard() ? gather_from_sequence_parallel_region(input, group_, in.dim)
                                 : copy_to_tensor_parallel_region(input, group_);
    y = at::linear(x, weight, bias);
  }
  if (style_.output_layouts().is_replicate()) y = gather_from_tensor_parallel_region(y, group_);
  return y;
}

std::map<std::string, TensorParallelSplit> ColwiseParallelLinearImpl::tensor_parallel_splits() const {
  std::map<std::string, TensorParallelSplit> splits{{"weight", {group_, 0}}};
  if (bias.defined()) splits.emplace("bias", TensorParallelSplit{group_, 0});
  return splits;
}

void ColwiseParallelLinearImpl::pretty_print(std::ostream& stream) const {
  stream << "cpprun::ColwiseParallelLinear(in_features=" << in_features << ", out_features=" << out_features
         << " (" << weight.size(0) << " on this rank), bias=" << bias.defined() << ", input_layouts="
         << style_.input_layouts().str() << ", output_layouts=" << style_.output_layouts().str()
         << (style_.input_layouts().is_shard() && style_.keep_gathered_input() ? ", keep_gathered_input=true" : "")
         << ", tp=" << group_.size() << ")";
}

RowwiseParallelLinearImpl::RowwiseParallelLinearImpl(const torch::nn::LinearImpl& full, ProcessGroup group,
                                                     RowwiseParallel style)
    : in_features(full.options.in_features()), out_features(full.options.out_features()),
      group_(std::move(group)), style_(style) {
  check_member(group_, "RowwiseParallelLinear");
  detail::check_rowwise_linear(style_);
  weight = register_parameter("weight", shard_of(full.weight, group_, 1, "RowwiseParallel"),
                              full.weight.requires_grad());
  if (full.bias.defined()) {
    at::NoGradGuard no_grad;
    bias = register_parameter("bias", full.bias.detach().clone(), full.bias.requires_grad());
  }
  detail::register_split_parameters(*this, *this);  // Note [Split parameters in a parameter list]
}

at::Tensor RowwiseParallelLinearImpl::forward(const at::Tensor& input) {
  const Placement in = style_.input_layouts(), out = style_.output_layouts();
  at::Tensor x = in.is_replicate() ? scatter_to_tensor_parallel_region(input, group_) : input;
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) == weight.size(1), "cpprun::RowwiseParallelLinear: the input (shape ",
              input.sizes(), ", input_layouts ", in.str(), ") gives ", x.dim() ? x.size(-1) : 0, " features on this "
              "rank; this rank's shard expects ", weight.size(1), " (", in_features, " features split over ",
              group_.size(), " ranks).");
  at::Tensor y = at::linear(x, weight);
  y = out.is_replicate() ? reduce_from_tensor_parallel_region(y, group_)
                         : reduce_scatter_to_sequence_parallel_region(y, group_, out.dim);
  if (bias.defined()) {
    // Added once, after the reduction. On shards each rank's bias gradient covers its own part
    // only (its tokens; its features when the output is split along them, as PyTorch allows):
    // the copy's backward sums them.
    if (out.is_replicate()) return y + bias;
    const at::Tensor whole = copy_to_tensor_parallel_region(bias, group_);
    const int64_t last = y.dim() - 1;
    const bool along_features = out.dim == -1 || out.dim == last;
    y = y + (along_features ? whole.chunk(group_.size(), 0)[group_.rank()] : whole);
  }
  return y;
}

std::map<std::string, TensorParallelSplit> RowwiseParallelLinearImpl::tensor_parallel_splits() const {
  return {{"weight", {group_, 1}}};  // the bias is whole, added after the reduction
}

void RowwiseParallelLinearImpl::pretty_print(std::ostream& stream) const {
  stream << "cpprun::RowwiseParallelLinear(in_features=" << in_features << " (" << weight.size(1)
         << " on this rank), out_features=" << out_features << ", bias=" << bias.defined() << ", input_layouts="
         << style_.input_layouts().str() << ", output_layouts=" << style_.output_layouts().str() << ", tp="
         << group_.size() << ")";
}

VocabParallelEmbeddingImpl::VocabParallelEmbeddingImpl(const torch::nn::EmbeddingImpl& full, ProcessGroup group,
                                                       RowwiseParallel style)
    : num_embeddings(full.weight.size(0)), embedding_dim(full.weight.size(1)), group_(std::move(group)),
      style_(style) {
  check_member(group_, "VocabParallelEmbedding");
  detail::check_vocab_parallel_embedding(full.options, style_);
  weight = register_parameter("weight", shard_of(full.weight, group_, 0, "RowwiseParallel"),
                              full.weight.requires_grad());
  vocab_start_ = group_.rank() * weight.size(0);
  detail::register_split_parameters(*this, *this);  // Note [Split parameters in a parameter list]
}

at::Tensor VocabParallelEmbeddingImpl::forward(const at::Tensor& ids) {
  // Note [An Embedding's ids under RowwiseParallel]
  // As PyTorch's: input_layouts Replicate() takes every rank's ids whole (the usual plan,
  // torchtitan's); Shard(d), the style's default Shard(-1) included, takes each rank's ids as its
  // chunk along d and gathers them first, so that the output covers every rank's ids. A plan that
  // left the default on whole ids once looked them up as if Replicate(): the same plan in PyTorch
  // gives t times the tokens, so the two disagreed without an error.
  const Placement in = style_.input_layouts();
  TORCH_CHECK(in.is_replicate() || (in.dim >= -ids.dim() && in.dim < ids.dim()), "cpprun::RowwiseParallel: "
              "input_layouts ", in.str(), " names no dimension of the Embedding's ids (shape ", ids.sizes(), "): give "
              "Shard(d) with d a dimension of the ids (each rank its chunk along d), or Replicate() (the same ids on "
              "every rank).");
  const at::Tensor all_ids =
      in.is_replicate() ? ids : tp::all_gather_along(ids, group_, in.dim, "RowwiseParallel Embedding's ids");
  // An id outside the vocabulary would be outside every rank's rows and look up zeros on all of them
  // (PyTorch's MaskPartial does so silently); one process's Embedding refuses it, and so does this.
  if (all_ids.numel() > 0) {
    const auto [low, high] = at::aminmax(all_ids);
    const int64_t lowest = low.item<int64_t>(), highest = high.item<int64_t>();
    TORCH_CHECK(lowest >= 0 && highest < num_embeddings, "cpprun::VocabParallelEmbedding: ids range over [", lowest,
                ", ", highest, "], but the embedding has ", num_embeddings, " rows (", weight.size(0), " on each of ",
                group_.size(), " ranks); an id must be in [0, ", num_embeddings, ").");
  }
  const int64_t rows = weight.size(0);
  at::Tensor outside = (all_ids < vocab_start_) | (all_ids >= vocab_start_ + rows);
  at::Tensor local = (all_ids - vocab_start_).masked_fill(outside, 0);
  at::Tensor y = at::embedding(weight, local).masked_fill(outside.unsqueeze(-1), 0);
  const Placement out = style_.output_layouts();
  return out.is_replicate() ? reduce_from_tensor_parallel_region(y, group_)
                            : reduce_scatter_to_sequence_parallel_region(y, group_, out.dim);
}

at::Tensor vocab_parallel_logits(const at::Tensor& hidden, const VocabParallelEmbeddingImpl& embedding,
                                 Placement hidden_layout) {
  TORCH_CHECK(hidden.dim() >= 1 && hidden.size(-1) == embedding.embedding_dim, "cpprun::vocab_parallel_logits: the "
              "hidden state's last dimension is ", (hidden.dim() ? hidden.size(-1) : 0), ", the embedding's width ",
              embedding.embedding_dim, ".");
  if (hidden_layout.is_shard()) {  // sequence parallel: the whole sequence's logits from this rank's tokens
    return sequence_parallel_column_linear(hidden, embedding.weight, {}, embedding.process_group(), hidden_layout.dim);
  }
  return at::linear(copy_to_tensor_parallel_region(hidden, embedding.process_group()), embedding.weight);
}

std::map<std::string, TensorParallelSplit> VocabParallelEmbeddingImpl::tensor_parallel_splits() const {
  return {{"weight", {group_, 0}}};
}

void VocabParallelEmbeddingImpl::pretty_print(std::ostream& stream) const {
  stream << "cpprun::VocabParallelEmbedding(num_embeddings=" << num_embeddings << " (ids " << vocab_start_ << ".."
         << vocab_start_ + weight.size(0) - 1 << " on this rank), embedding_dim=" << embedding_dim
         << ", output_layouts=" << style_.output_layouts().str() << ", tp=" << group_.size() << ")";
}

ColwiseParallelEmbeddingImpl::ColwiseParallelEmbeddingImpl(const torch::nn::EmbeddingImpl& full, ProcessGroup group,
                                                           ColwiseParallel style)
    : num_embeddings(full.weight.size(0)), embedding_dim(full.weight.size(1)), group_(std::move(group)),
      style_(style) {
  check_member(group_, "ColwiseParallelEmbedding");
  detail::check_colwise_embedding(full.options, style_);
  weight = register_parameter("weight", shard_of(full.weight, group_, 1, "ColwiseParallel"),
                              full.weight.requires_grad());
  detail::register_split_parameters(*this, *this);  // Note [Split parameters in a parameter list]
}

at::Tensor ColwiseParallelEmbeddingImpl::forward(const at::Tensor& ids) {
  at::Tensor y = at::embedding(weight, ids);  // this rank's columns of every id's row
  return style_.output_layouts().is_replicate() ? gather_from_tensor_parallel_region(y, group_) : y;
}

std::map<std::string, TensorParallelSplit> ColwiseParallelEmbeddingImpl::tensor_parallel_splits() const {
  return {{"weight", {group_, 1}}};
}

void ColwiseParallelEmbeddingImpl::pretty_print(std::ostream& stream) const {
  stream << "cpprun::ColwiseParallelEmbedding(num_embeddings=" << num_embeddings << ", embedding_dim="
         << embedding_dim << " (" << weight.size(1) << " on this rank), output_layouts="
         << style_.output_layouts().str() << ", tp=" << group_.size() << ")";
}

SequenceParallelLayerNormImpl::SequenceParallelLayerNormImpl(const torch::nn::LayerNormImpl& full, ProcessGroup group,
                                                             SequenceParallel style)
    : normalized_shape(full.options.normalized_shape()), eps(full.options.eps()), group_(std::move(group)),
      style_(style) {
  check_member(group_, "SequenceParallelLayerNorm");
  at::NoGradGuard no_grad;
  if (full.weight.defined()) {
    weight = register_parameter("weight", full.weight.detach().clone(), full.weight.requires_grad());
    bias = register_parameter("bias", full.bias.detach().clone(), full.bias.requires_grad());
  }
}

at::Tensor SequenceParallelLayerNormImpl::forward(const at::Tensor& input) {
  if (!weight.defined()) return at::layer_norm(input, normalized_shape, {}, {}, eps);
  return at::layer_norm(input, normalized_shape, copy_to_tensor_parallel_region(weight, group_),
                        copy_to_tensor_parallel_region(bias, group_), eps);
}

std::map<std::string, TensorParallelSplit> SequenceParallelLayerNormImpl::tensor_parallel_splits() const {
  return {};  // weight and bias whole on every rank; the mappings sum their gradients
}

void SequenceParallelLayerNormImpl::pretty_print(std::ostream& stream) const {
  stream << "cpprun::SequenceParallelLayerNorm(" << at::IntArrayRef(normalized_shape) << ", eps=" << eps
         << ", sequence_dim=" << style_.sequence_dim() << ", tp=" << group_.size() << ")";
}

}  // namespace cpprun
