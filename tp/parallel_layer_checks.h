// The refusals of the tensor-parallel layers' constructors that depend only on the whole module's
// options and the style. parallelize_module makes them for every plan entry before it replaces any
// (it then cuts and places one entry at a time), so that a refused plan leaves the module whole;
// the constructors make them too, for a layer built by hand.
#pragma once

#include <torch/nn/options/dropout.h>
#include <torch/nn/options/embedding.h>

#include "cpprun/tensor_parallel_styles.h"

namespace cpprun::detail {

void check_colwise_linear(const ColwiseParallel& style);
void check_rowwise_linear(const RowwiseParallel& style);
void check_colwise_embedding(const torch::nn::EmbeddingOptions& options, const ColwiseParallel& style);
void check_vocab_parallel_embedding(const torch::nn::EmbeddingOptions& options, const RowwiseParallel& style);
void check_sequence_parallel_dropout(const torch::nn::DropoutOptions& options);

}  // namespace cpprun::detail
