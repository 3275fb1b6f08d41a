// A small GPT for the tensor-parallel tests: a token embedding that is also the output layer, pre-LN
// blocks of causal self-attention and an MLP, dropout on the attention probabilities and on each
// residual branch, a final LayerNorm. Each layer parallelize_module may replace is reached through
// the registry (a Sequential entry), so after gpt_plan() below the same forward runs the split
// model Megatron-style: q, k, v and fc1 column-parallel (this rank's heads and hidden columns),
// the attention's output projection and fc2 row-parallel, the embedding vocabulary-parallel with
// the head tied to it, and with sequence parallelism the LayerNorms and residual dropouts on
// sequence shards.
#pragma once

#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <string>

#include "cpprun/tensor_parallel.h"

namespace tp_test {

struct GptBlockImpl : torch::nn::Module {
  static constexpr int64_t kHidden = 12, kHeads = 4, kHeadDim = kHidden / kHeads;
  static constexpr double kDropout = 0.2;
  torch::nn::Sequential ln_1, q, k, v, attn_out, mlp;

  GptBlockImpl() {
    using namespace torch::nn;
    ln_1 = register_module("ln_1", Sequential(LayerNorm(LayerNormOptions({kHidden}))));
    q = register_module("q", Sequential(Linear(kHidden, kHidden)));
    // No bias on k: softmax over the keys ignores what a key bias adds (the same q·b for every
    // key), so its gradient is rounding noise, which AdamW would turn into steps of lr.
    k = register_module("k", Sequential(Linear(LinearOptions(kHidden, kHidden).bias(false))));
    v = register_module("v", Sequential(Linear(kHidden, kHidden)));
    attn_out = register_module("attn_out", Sequential(Linear(kHidden, kHidden), Dropout(kDropout)));
    mlp = register_module("mlp", Sequential(LayerNorm(LayerNormOptions({kHidden})), Linear(kHidden, 4 * kHidden),
                                            GELU(), Linear(4 * kHidden, kHidden), Dropout(kDropout)));
  }

  // x: [batch, sequence, hidden], or this rank's sequence shard under sequence parallelism.
  at::Tensor forward(at::Tensor x) {
    const at::Tensor h = ln_1->forward(x);
    // [batch, sequence, heads here, head dim] -> [batch, heads here, sequence, head dim]
    auto heads = [](const at::Tensor& t) { return t.view({t.size(0), t.size(1), -1, kHeadDim}).transpose(1, 2); };
    const at::Tensor qh = heads(q->forward(h)), kh = heads(k->forward(h)), vh = heads(v->forward(h));
    const int64_t sequence = qh.size(2);
    const at::Tensor causal = at::ones({sequence, sequence}, at::kBool).triu(1);
    at::Tensor probs = (qh.matmul(kh.transpose(-2, -1)) / std::sqrt(static_cast<double>(kHeadDim)))
                           .masked_fill(causal, -std::numeric_limits<float>::infinity())
                           .softmax(-1);
    // Split by heads across the group: each rank its heads' slice of the whole mask.
    if (auto* split = q->ptr(0)->as<cpprun::ColwiseParallelLinearImpl>()) {
      probs = cpprun::tensor_parallel_dropout(probs, kDropout, is_training(), split->process_group(), 1);
    } else {
      probs = torch::dropout(probs, kDropout, is_training());
    }
    const at::Tensor attended = probs.matmul(vh).transpose(1, 2).flatten(2);  // [batch, sequence, heads here * dim]
    x = x + attn_out->forward(attended);
    return x + mlp->forward(x);
  }
};
TORCH_MODULE(GptBlock);

struct GptImpl : torch::nn::Module {
  static constexpr int64_t kVocab = 24, kBlocks = 2;
  torch::nn::Embedding embed{nullptr};
  torch::nn::ModuleList h;
  torch::nn::Sequential ln_f;
  bool checkpoint_blocks = false;

  GptImpl() {
    torch::manual_seed(17);
    embed = register_module("embed", torch::nn::Embedding(kVocab, GptBlockImpl::kHidden));
    for (int64_t b = 0; b < kBlocks; ++b) h->push_back(GptBlock());
    register_module("h", h);
    ln_f = register_module("ln_f", torch::nn::Sequential(
                                       torch::nn::LayerNorm(torch::nn::LayerNormOptions({GptBlockImpl::kHidden}))));
    to(torch::kDouble);  // the parity tests compare in float64
  }

  // ids: [batch, sequence], whole on every rank. Returns the logits: [batch, sequence, vocab], or
  // after gpt_plan() this rank's vocabulary columns of them for the whole sequence.
  at::Tensor forward(const at::Tensor& ids) {
    auto* split = named_children()["embed"]->as<cpprun::VocabParallelEmbeddingImpl>();
    at::Tensor x = split ? split->forward(ids) : embed->forward(ids);
    for (const auto& entry : *h) {
      auto block = std::dynamic_pointer_cast<GptBlockImpl>(entry);
      x = checkpoint_blocks ? cpprun::checkpoint([block](const at::Tensor& in) { return block->forward(in); }, x)
                            : block->forward(x);
    }
    x = ln_f->forward(x);
    if (!split) return at::linear(x, embed->weight);
    return cpprun::vocab_parallel_logits(x, *split, sequence_parallel ? cpprun::Shard(1) : cpprun::Replicate());
  }
  bool sequence_parallel = false;  // set by gpt_plan
};
TORCH_MODULE(Gpt);

// Megatron's split of the GPT above, with or without sequence parallelism (dim 1 of [batch,
// sequence, hidden]).
inline cpprun::ParallelizePlan gpt_plan(GptImpl& gpt, bool sequence_parallel) {
  gpt.sequence_parallel = sequence_parallel;
  const cpprun::Placement between = sequence_parallel ? cpprun::Shard(1) : cpprun::Replicate();
  const auto colwise = cpprun::ColwiseParallel().input_layouts(between);
  const auto rowwise = cpprun::RowwiseParallel().output_layouts(between);
  const auto embed = cpprun::RowwiseParallel().input_layouts(cpprun::Replicate()).output_layouts(between);
  cpprun::ParallelizePlan plan{{"embed", embed}};
  for (int64_t b = 0; b < GptImpl::kBlocks; ++b) {
    const std::string block = "h." + std::to_string(b) + ".";
    for (const char* name : {"q.0", "k.0", "v.0", "mlp.1"}) plan.push_back({block + name, colwise});
    plan.push_back({block + "attn_out.0", rowwise});
    plan.push_back({block + "mlp.3", rowwise});
    if (sequence_parallel) {
      for (const char* name : {"ln_1.0", "attn_out.1", "mlp.0", "mlp.4"}) {
        plan.push_back({block + name, cpprun::SequenceParallel()});
      }
    }
  }
  if (sequence_parallel) plan.push_back({"ln_f.0", cpprun::SequenceParallel()});
  return plan;
}

}  // namespace tp_test
