// A language model whose output layer is its token embedding, for the tensor-parallel tests:
// logits = norm(embed(ids)) · embedᵀ. Unsplit, the head uses the embedding's weight directly;
// after parallelize_module plans "embed" RowwiseParallel, the embedding is vocabulary-parallel
// and vocab_parallel_logits uses its shard, so the two stay one tensor (this rank's columns of
// the logits).
#pragma once

#include <torch/torch.h>

#include "cpprun/tensor_parallel.h"

namespace tp_test {

struct TiedLmImpl : torch::nn::Module {
  static constexpr int64_t kVocab = 24, kHidden = 12;
  torch::nn::Embedding embed{nullptr};
  torch::nn::LayerNorm norm{nullptr};
  TiedLmImpl() {
    torch::manual_seed(13);
    embed = register_module("embed", torch::nn::Embedding(kVocab, kHidden));
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kHidden})));
    to(torch::kDouble);  // the parity tests compare in float64
  }
  // Through the registry, where parallelize_module put the vocabulary-parallel embedding.
  at::Tensor forward(const at::Tensor& ids) {
    auto module = named_children()["embed"];
    if (auto* split = module->as<cpprun::VocabParallelEmbeddingImpl>()) {
      return cpprun::vocab_parallel_logits(norm(split->forward(ids)), *split);
    }
    return at::linear(norm(embed(ids)), embed->weight);
  }
};
TORCH_MODULE(TiedLm);

}  // namespace tp_test
