// Tensor parallelism under `cpprun --nproc_per_node=K`, K = 1..4, every rank one TP group: the
// mappings' forward and backward, and parity with one process (float64, AdamW) of an MLP block
// (LayerNorm, ColwiseParallel + GELU + RowwiseParallel; also with the LayerNorm on sequence
// shards and all-gather / reduce-scatter at the edges of that region) and of
// a vocabulary-parallel embedding + head + vocabulary-parallel cross-entropy; the MLP clipped by
// cpprun::clip_grad_norm_(parallel->parameters()) against one process's clip of the whole; bad
// plans get named errors. Every rank builds the same model from one seed and sees the same data; the parameters
// are compared through tensor_parallel_full_state_dict, which also loads into an unsplit model.
// Models and data are float64, so that a wrong sum or a wrong row stands out from rounding on any CPU.
#include "catch.h"
#include <torch/torch.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "cpprun/cpprun.h"
#include "cpprun/tensor_parallel.h"
#include "ddp_test_models.h"
#include "counting_allocator.h"
#include "dist_test_support.h"
#include "tied_lm.h"
#include "tp/tp_collectives.h"

using dist_test::group;
using ddp_test::relative_difference;

namespace {

// In float64 the split models and the one-process reference differ by summation order alone: the
// worst over every check at 1 to 4 ranks was 3.8e-15 (relative; each compared value's largest,
// printed per rank). A wrong gradient or a misplaced row moves a parameter by about the learning
// rate per AdamW step, far past it.
constexpr double kTolerance = 1e-10;
constexpr int kSteps = 6;
const auto kF64 = at::TensorOptions().dtype(at::kDouble);

// Features and vocabulary divide by 1, 2, 3 and 4.
torch::nn::Sequential make_mlp() {
  torch::manual_seed(7);
  torch::nn::Sequential mlp(torch::nn::LayerNorm(torch::nn::LayerNormOptions({12})), torch::nn::Linear(12, 48),
                            torch::nn::GELU(), torch::nn::Linear(48, 12));
  mlp->to(at::kDouble);
  return mlp;
}

torch::nn::Sequential make_lm() {
  torch::manual_seed(9);
  torch::nn::Sequential lm(torch::nn::Embedding(24, 12), torch::nn::Linear(12, 24));
  lm->to(at::kDouble);
  return lm;
}

double relative(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-12); }


// The parallel model's gathered state dict (tensor_parallel_full_state_dict) against the
// reference's parameters, name by name; then loaded into a fresh unsplit model, whose output on
// `input` must be the reference's.
// The parallel module's gathered state dict against the reference's parameters, name by name.
torch::OrderedDict<std::string, at::Tensor> check_full_state(torch::nn::Module& trained,
                                                             const torch::nn::Module& reference) {
  const auto full = cpprun::tensor_parallel_full_state_dict(trained);
  const auto ref = reference.named_parameters();
  CHECK(full.size() == ref.size());
  for (const auto& item : ref) {
    const at::Tensor* whole = full.find(item.key());
    REQUIRE(whole != nullptr);
    REQUIRE(whole->sizes() == item.value().sizes());
    const double diff = relative_difference(*whole, item.value());
    INFO("parameter " << item.key() << " relative difference " << diff);
    CHECK(diff <= kTolerance);
  }
  return full;
}

template <typename MakeModel>
void check_parameters(torch::nn::Sequential& trained, torch::nn::Sequential& reference, MakeModel make_model,
                      const at::Tensor& input) {
  const auto full = check_full_state(*trained, *reference);
  auto unsplit = make_model();
  {
    at::NoGradGuard no_grad;
    for (auto& item : unsplit->named_parameters()) item.value().copy_(full[item.key()]);
  }
  CHECK(relative_difference(unsplit->forward(input), reference->forward(input)) <= kTolerance);
}

// Trains `parallel` and `reference` (language models of make_lm's shape, alike before the split)
// kSteps AdamW steps on one batch drawn from `seed`: each step the split model's loss,
// `parallel_loss(ids, target)`, must be the reference's cross-entropy; then the parameters must
// agree (check_parameters).
template <typename Loss>
void train_lm_against_reference(torch::nn::Sequential& parallel, torch::nn::Sequential& reference, uint64_t seed,
                                Loss parallel_loss) {
  torch::manual_seed(seed);
  const at::Tensor ids = torch::randint(24, {6, 10}), target = torch::randint(24, {6, 10});
  torch::optim::AdamW reference_opt(reference->parameters(), torch::optim::AdamWOptions(1e-2));
  torch::optim::AdamW parallel_opt(parallel->parameters(), torch::optim::AdamWOptions(1e-2));
  for (int step = 0; step < kSteps; ++step) {
    reference_opt.zero_grad();
    at::Tensor reference_loss = at::cross_entropy_loss(reference->forward(ids).view({-1, 24}), target.view(-1));
    reference_loss.backward();
    reference_opt.step();

    parallel_opt.zero_grad();
    at::Tensor loss = parallel_loss(ids, target);
    loss.backward();
    parallel_opt.step();
    INFO("step " << step << " loss " << loss.item<double>() << " reference " << reference_loss.item<double>());
    CHECK(relative(loss.item<double>(), reference_loss.item<double>()) <= kTolerance);
  }
  check_parameters(parallel, reference, make_lm, ids);
}

}  // namespace

TEST_CASE("tensor parallel: the mappings' forward and backward", "[tp]") {
  const int world = group().size(), rank = group().rank();
  const double ranks_sum = world * (world + 1) / 2.0;  // sum of (rank + 1)

  at::Tensor x = at::ones({2, 4 * world}).requires_grad_();
  (cpprun::copy_to_tensor_parallel_region(x, group()) * (rank + 1)).sum().backward();
  CHECK(x.grad().eq(ranks_sum).all().item<bool>());  // backward: all-reduce

  at::Tensor y = at::ones({2, 3}).requires_grad_();
  at::Tensor reduced = cpprun::reduce_from_tensor_parallel_region(y * (rank + 1), group());
  CHECK(reduced.eq(ranks_sum).all().item<bool>());   // forward: all-reduce
  reduced.sum().backward();
  CHECK(y.grad().eq(rank + 1).all().item<bool>());   // backward: identity

  // Columns 0..4*world-1 of a row: rank r keeps columns 4r..4r+3; the gather puts them back.
  at::Tensor row = at::arange(4 * world, at::kFloat).repeat({2, 1}).requires_grad_();
  at::Tensor mine = cpprun::scatter_to_tensor_parallel_region(row, group());
  CHECK(mine.equal(row.detach().narrow(1, 4 * rank, 4)));
  at::Tensor back = cpprun::gather_from_tensor_parallel_region(mine, group());
  CHECK(back.equal(row.detach()));
  (back * (rank + 1)).sum().backward();
  // gather's backward keeps this rank's columns of its own gradient; scatter's gathers them.
  CHECK(row.grad().narrow(1, 4 * rank, 4).eq(rank + 1).all().item<bool>());

  // Sequence parallel along dim 1 (given as -2): rank r keeps positions 3r..3r+2 of every row;
  // the backward all-gathers, so each rank's gradient lands on its own positions.
  at::Tensor tokens = at::arange(2 * 3 * world * 5, at::kFloat).view({2, 3 * world, 5}).requires_grad_();
  at::Tensor my_tokens = cpprun::scatter_to_sequence_parallel_region(tokens, group(), -2);
  CHECK(my_tokens.sizes() == at::IntArrayRef{2, 3, 5});
  CHECK(my_tokens.equal(tokens.detach().narrow(1, 3 * rank, 3)));
  (my_tokens * (rank + 1)).sum().backward();
  for (int r = 0; r < world; ++r) {
    INFO("positions of rank " << r);
    CHECK(tokens.grad().narrow(1, 3 * r, 3).eq(r + 1).all().item<bool>());
  }

  // Sequence parallel along dim 1: reduce-scatter is the sum's chunk; its backward all-gathers.
  at::Tensor seq = at::arange(3 * world, at::kFloat).view({1, 3 * world, 1}).repeat({2, 1, 5}).requires_grad_();
  at::Tensor scattered = cpprun::reduce_scatter_to_sequence_parallel_region(seq, group(), 1);
  CHECK(scattered.equal(seq.detach().narrow(1, 3 * rank, 3) * world));
  at::Tensor gathered = cpprun::gather_from_sequence_parallel_region(scattered, group(), 1);
  CHECK(gathered.equal(seq.detach() * world));
  gathered.sum().backward();  // gather's backward reduce-scatters (world), reduce-scatter's all-gathers
  CHECK(seq.grad().eq(world).all().item<bool>());

  if (world > 1) {
    CHECK_THROWS_WITH(cpprun::scatter_to_tensor_parallel_region(at::ones({2, 4 * world + 1}), group()),
                      Catch::Contains("does not divide by the tensor-parallel group's size " + std::to_string(world)));
    CHECK_THROWS_WITH(cpprun::scatter_to_sequence_parallel_region(at::ones({2, 3 * world + 1, 5}), group(), 1),
                      Catch::Contains("scatter_to_sequence_parallel_region: dimension 1") &&
                          Catch::Contains("group's size " + std::to_string(world)));
  }
}

// parallelize_module builds and places each entry in turn, the whole module let go before the next
// is cut, as PyTorch's goes module by module: built all first, every planned module's whole
// weights and all their shards were alive at once (a peak of 1.33x PyTorch's: an audit, 2026-12-07).
TEST_CASE("tensor parallel: parallelize_module holds one entry's shard beyond the model at a time", "[tp]") {
  const int world = group().size();
  dist_test::CountingAllocator& counter = dist_test::counting_allocator();
  torch::manual_seed(3);
  constexpr int64_t kFeatures = 240;  // divides by 1, 2, 3 and 4
  torch::nn::Sequential net;
  for (int i = 0; i < 4; ++i) {
    net->push_back(torch::nn::Linear(torch::nn::LinearOptions(kFeatures, kFeatures).bias(false)));
  }
  const cpprun::ParallelizePlan plan{{"0", cpprun::ColwiseParallel()}, {"1", cpprun::RowwiseParallel()},
                                     {"2", cpprun::ColwiseParallel()}, {"3", cpprun::RowwiseParallel()}};
  cpprun::barrier(group());
  const int64_t before = counter.start();
  cpprun::parallelize_module(net.ptr(), group(), plan);
  const int64_t extra = counter.peak - before;
  const int64_t shard = kFeatures * kFeatures * 4 / world;
  INFO("parallelize_module's peak beyond the model: " << extra << " bytes; one shard " << shard);
  CHECK(extra < shard * 3 / 2);  // all four shards, beside the whole weights, at once before

  // A refusal a layer makes (here an Embedding option, after a valid entry) still comes before
  // anything is replaced: the module stays whole.
  torch::nn::Sequential lm(torch::nn::Linear(12, 24),
                           torch::nn::Embedding(torch::nn::EmbeddingOptions(24, 12).padding_idx(0)));
  CHECK_THROWS_WITH(cpprun::parallelize_module(lm.ptr(), group(), {{"0", cpprun::ColwiseParallel()},
                                                                  {"1", cpprun::RowwiseParallel()}}),
                    Catch::Contains("padding_idx"));
  CHECK(lm[0]->as<torch::nn::Linear>() != nullptr);
  CHECK(lm->named_children()["0"]->as<torch::nn::Linear>() != nullptr);
}

TEST_CASE("tensor parallel: tensor_parallel_splits names each split parameter, its dimension and group", "[tp]") {
  const int world = group().size(), rank = group().rank();
  auto whole = make_mlp();
  CHECK(cpprun::tensor_parallel_splits(*whole).empty());
  auto parallel = make_mlp();
  cpprun::parallelize_module(parallel.ptr(), group(), {{"1", cpprun::ColwiseParallel()},
                                                       {"3", cpprun::RowwiseParallel()},
                                                       {"0", cpprun::SequenceParallel()}});
  const auto splits = cpprun::tensor_parallel_splits(*parallel);
  // fc1's rows (weight and bias), fc2's columns; fc2's bias and the LayerNorm are whole.
  const std::map<std::string, int64_t> expected{{"1.weight", 0}, {"1.bias", 0}, {"3.weight", 1}};
  CHECK(splits.size() == expected.size());
  const auto params = parallel->named_parameters();
  const auto reference = whole->named_parameters();
  for (const auto& [name, dim] : expected) {
    INFO(name);
    const auto found = splits.find(name);
    REQUIRE(found != splits.end());
    CHECK(found->second.dim == dim);
    CHECK(found->second.parts == 1);
    CHECK(found->second.group.size() == world);
    CHECK(found->second.group.rank() == rank);
    // This rank holds chunk `rank` along that dimension.
    CHECK(params[name].equal(reference[name].chunk(world, dim)[rank]));
  }

  // A layer of one's own: a fused [q; k; v] projection split by heads, block by block (parts 3),
  // whose rank r holds chunk r of each block; the gather puts every block's chunks back in order.
  struct FusedImpl : torch::nn::Module, cpprun::TensorParallelModule {
    explicit FusedImpl(const at::Tensor& whole_weight, cpprun::ProcessGroup g) : tp(std::move(g)) {
      std::vector<at::Tensor> mine;
      for (const auto& block : whole_weight.chunk(3, 0)) mine.push_back(block.chunk(tp.size(), 0)[tp.rank()]);
      qkv = register_parameter("qkv", at::cat(mine, 0));
    }
    std::map<std::string, cpprun::TensorParallelSplit> tensor_parallel_splits() const override {
      return {{"qkv", {tp, 0, 3}}};
    }
    cpprun::ProcessGroup tp;
    at::Tensor qkv;
  };
  auto outer = std::make_shared<torch::nn::Module>();
  const at::Tensor fused_whole = at::arange(3 * 2 * world * 4, kF64).view({3 * 2 * world, 4});
  outer->register_module("attn", std::make_shared<FusedImpl>(fused_whole, group()));
  const auto fused_splits = cpprun::tensor_parallel_splits(*outer);
  REQUIRE(fused_splits.count("attn.qkv") == 1);
  CHECK(fused_splits.at("attn.qkv").parts == 3);
  CHECK(cpprun::tensor_parallel_full_state_dict(*outer)["attn.qkv"].equal(fused_whole));
}

TEST_CASE("tensor parallel: the column linear on sequence shards is linear over the gathered input", "[tp]") {
  const int world = group().size(), rank = group().rank();
  torch::manual_seed(5);  // the same on every rank: each takes its own slice below
  const at::Tensor x = torch::randn({2, 3 * world, 8}, kF64), w = torch::randn({4 * world, 8}, kF64);
  const at::Tensor b = torch::randn({4 * world}, kF64);
  const at::Tensor grad_out = torch::randn({2, 3 * world, 4}, kF64);  // this rank's output columns' gradient, per rank
  auto run = [&](bool fused) {
    at::Tensor shard = x.chunk(world, 1)[rank].clone().requires_grad_();
    at::Tensor weight = w.chunk(world, 0)[rank].clone().requires_grad_();
    at::Tensor bias = b.chunk(world, 0)[rank].clone().requires_grad_();
    at::Tensor y = fused ? cpprun::sequence_parallel_column_linear(shard, weight, bias, group(), 1)
                         : at::linear(cpprun::gather_from_sequence_parallel_region(shard, group(), 1), weight, bias);
    (y * (grad_out + rank)).sum().backward();
    return std::vector<at::Tensor>{y.detach(), shard.grad(), weight.grad(), bias.grad()};
  };
  const auto fused = run(true), composed = run(false);
  for (std::size_t i = 0; i < fused.size(); ++i) {
    INFO("output, input, weight and bias gradients: " << i);
    CHECK(relative_difference(fused[i], composed[i]) <= kTolerance);
  }
  // The whole layer in one process: this rank's output columns.
  CHECK(relative_difference(fused[0], at::linear(x, w, b).chunk(world, 2)[rank]) <= kTolerance);
  CHECK_THROWS_WITH(cpprun::sequence_parallel_column_linear(x, w, b, group(), 2),
                    Catch::Contains("is the feature dimension"));
}

TEST_CASE("tensor parallel: an MLP block matches one process after AdamW steps", "[tp]") {
  // 0: whole inputs; 1: sequence parallel (fc1 keeps its input's shard); 2: fc1 keeps the gathered input.
  const int layout = GENERATE(0, 1, 2);
  const bool sequence_parallel = layout > 0;
  const int world = group().size(), rank = group().rank();
  INFO("tp " << world << (sequence_parallel ? " with sequence parallelism" : "")
             << (layout == 2 ? ", keep_gathered_input" : ""));
  auto reference = make_mlp();
  auto parallel = make_mlp();
  cpprun::ColwiseParallel colwise;
  cpprun::RowwiseParallel rowwise;
  if (sequence_parallel) {  // [batch, sequence, hidden]: each rank holds a slice of the sequence
    colwise.input_layouts(cpprun::Shard(1)).keep_gathered_input(layout == 2);
    rowwise.output_layouts(cpprun::Shard(1));
  }
  cpprun::ParallelizePlan plan{{"1", colwise}, {"3", rowwise}};
  // A LayerNorm region on sequence shards: whole otherwise (every rank computes it alike).
  if (sequence_parallel) plan.push_back({"0", cpprun::SequenceParallel()});
  cpprun::parallelize_module(parallel.ptr(), group(), plan);
  CHECK(parallel[1]->as<cpprun::ColwiseParallelLinear>()->weight.size(0) == 48 / world);
  CHECK(parallel[3]->as<cpprun::RowwiseParallelLinear>()->weight.size(1) == 48 / world);
  CHECK((parallel[0]->as<cpprun::SequenceParallelLayerNorm>() != nullptr) == sequence_parallel);

  torch::manual_seed(11);
  const at::Tensor x = torch::randn({4, 12, 12}, kF64), target = torch::randn({4, 12, 12}, kF64);
  torch::optim::AdamW reference_opt(reference->parameters(), torch::optim::AdamWOptions(1e-2));
  torch::optim::AdamW parallel_opt(parallel->parameters(), torch::optim::AdamWOptions(1e-2));
  for (int step = 0; step < kSteps; ++step) {
    reference_opt.zero_grad();
    at::Tensor reference_loss = torch::mse_loss(reference->forward(x), target, at::Reduction::Sum) / x.numel();
    reference_loss.backward();
    reference_opt.step();

    parallel_opt.zero_grad();
    at::Tensor loss;
    if (sequence_parallel) {
      const at::Tensor out = parallel->forward(x.chunk(world, 1)[rank]);
      loss = torch::mse_loss(out, target.chunk(world, 1)[rank], at::Reduction::Sum) / x.numel();
    } else {
      loss = torch::mse_loss(parallel->forward(x), target, at::Reduction::Sum) / x.numel();
    }
    loss.backward();
    parallel_opt.step();
    at::Tensor whole_loss = loss.detach().clone();
    if (sequence_parallel) cpprun::all_reduce(group(), whole_loss);  // each rank's loss covers its tokens
    INFO("step " << step << " loss " << whole_loss.item<double>() << " reference " << reference_loss.item<double>());
    CHECK(relative(whole_loss.item<double>(), reference_loss.item<double>()) <= kTolerance);
  }
  check_parameters(parallel, reference, make_mlp, x);
}

TEST_CASE("tensor parallel: clip_grad_norm_ given the parameter list clips by the whole model's norm", "[tp]") {
  // As torch.nn.utils.clip_grad_norm_(model.parameters()) on DTensor parameters: the split
  // gradients' squares summed over the group, the whole ones (fc2's bias, the LayerNorm) counted
  // once. Before 2026-12: each rank's own norm, the ranks clipping by different factors.
  const bool sequence_parallel = GENERATE(false, true);
  const int world = group().size(), rank = group().rank();
  INFO("tp " << world << (sequence_parallel ? " with sequence parallelism" : ""));
  constexpr double kMaxNorm = 0.05;  // below the gradients' norm: clipping scales every step
  auto reference = make_mlp();
  auto parallel = make_mlp();
  cpprun::ColwiseParallel colwise;
  cpprun::RowwiseParallel rowwise;
  cpprun::ParallelizePlan plan;
  if (sequence_parallel) {
    colwise.input_layouts(cpprun::Shard(1));
    rowwise.output_layouts(cpprun::Shard(1));
    plan.push_back({"0", cpprun::SequenceParallel()});
  }
  plan.push_back({"1", colwise});
  plan.push_back({"3", rowwise});
  cpprun::parallelize_module(parallel.ptr(), group(), plan);

  torch::manual_seed(11);
  const at::Tensor x = torch::randn({4, 12, 12}, kF64), target = torch::randn({4, 12, 12}, kF64);
  torch::optim::AdamW reference_opt(reference->parameters(), torch::optim::AdamWOptions(1e-2));
  torch::optim::AdamW parallel_opt(parallel->parameters(), torch::optim::AdamWOptions(1e-2));
  for (int step = 0; step < kSteps; ++step) {
    reference_opt.zero_grad();
    at::Tensor reference_loss = torch::mse_loss(reference->forward(x), target, at::Reduction::Sum) / x.numel();
    reference_loss.backward();
    const double reference_norm = cpprun::clip_grad_norm_(reference->parameters(), kMaxNorm);
    reference_opt.step();

    parallel_opt.zero_grad();
    const at::Tensor out = parallel->forward(sequence_parallel ? x.chunk(world, 1)[rank] : x);
    const at::Tensor mine = sequence_parallel ? target.chunk(world, 1)[rank] : target;
    (torch::mse_loss(out, mine, at::Reduction::Sum) / x.numel()).backward();
    const double norm = cpprun::clip_grad_norm_(parallel->parameters(), kMaxNorm);
    parallel_opt.step();
    INFO("step " << step << " norm " << norm << " reference " << reference_norm);
    CHECK(reference_norm > kMaxNorm);
    CHECK(relative(norm, reference_norm) <= kTolerance);
  }
  check_parameters(parallel, reference, make_mlp, x);
  // The whole parameters (fc2's bias, the LayerNorm's) stay alike on every rank: each clipped
  // by the same factor.
  const auto splits = cpprun::tensor_parallel_splits(*parallel);
  for (const auto& item : parallel->named_parameters()) {
    if (splits.count(item.key())) continue;
    at::Tensor rank0 = item.value().detach().clone();
    cpprun::broadcast(group(), rank0, 0);
    INFO("whole parameter " << item.key());
    CHECK(item.value().detach().equal(rank0));
  }

  if (world > 1) {
    // Lists that differ across the group (rank 0 leaves out fc2's weight) are refused on every
    // rank, before any gradient changes.
    std::vector<at::Tensor> list;
    for (const auto& item : parallel->named_parameters()) {
      if (rank != 0 || item.key() != "3.weight") list.push_back(item.value());
    }
    const at::Tensor before = parallel[1]->as<cpprun::ColwiseParallelLinear>()->weight.grad().clone();
    CHECK_THROWS_WITH(cpprun::clip_grad_norm_(list, kMaxNorm),
                      Catch::Contains("were given different parameter lists") &&
                          Catch::Contains("pass model->parameters() (or the same subset) on each rank"));
    CHECK(parallel[1]->as<cpprun::ColwiseParallelLinear>()->weight.grad().equal(before));
  }
}

TEST_CASE("tensor parallel: vocabulary-parallel embedding and cross-entropy match one process", "[tp]") {
  const int world = group().size();
  auto reference = make_lm();
  auto parallel = make_lm();
  cpprun::parallelize_module(parallel.ptr(), group(),
                             {{"0", cpprun::RowwiseParallel().input_layouts(cpprun::Replicate())},
                              {"1", cpprun::ColwiseParallel()}});
  CHECK(parallel[0]->as<cpprun::VocabParallelEmbedding>()->weight.size(0) == 24 / world);

  train_lm_against_reference(parallel, reference, 13, [&](const at::Tensor& ids, const at::Tensor& target) {
    const at::Tensor logits = parallel->forward(ids);  // [6, 10, 24 / world]: never gathered
    CHECK(logits.size(-1) == 24 / world);
    return cpprun::vocab_parallel_cross_entropy(logits, target, group()).mean();
  });
  // An id outside the vocabulary is refused on every rank alike, as one process's Embedding
  // refuses it; it used to look up zeros on every rank and train on them.
  const at::Tensor ids = at::arange(6, at::kLong).view({2, 3});
  CHECK_THROWS_WITH(parallel->forward(ids + 19), Catch::Contains("ids range over [19, 24], but the embedding has 24 "
                                                                 "rows"));
  CHECK_THROWS_WITH(parallel->forward(ids - 1), Catch::Contains("ids range over [-1, 4]"));
}

TEST_CASE("tensor parallel: an embedding split by its dimension (ColwiseParallel) matches one process", "[tp]") {
  // Shard(-1): the embedding's columns feed a row-parallel Linear as they are (no communication
  // between them); Replicate(): all-gathered, into a whole Linear.
  const bool gathered = GENERATE(false, true);
  const int world = group().size();
  INFO("output_layouts " << (gathered ? "Replicate()" : "Shard(-1)"));
  auto reference = make_lm();
  auto parallel = make_lm();
  cpprun::ParallelizePlan plan{{"0", cpprun::ColwiseParallel().output_layouts(gathered ? cpprun::Replicate()
                                                                                        : cpprun::Shard(-1))}};
  if (!gathered) plan.push_back({"1", cpprun::RowwiseParallel()});
  cpprun::parallelize_module(parallel.ptr(), group(), plan);
  REQUIRE(parallel[0]->as<cpprun::ColwiseParallelEmbedding>() != nullptr);
  CHECK(parallel[0]->as<cpprun::ColwiseParallelEmbedding>()->weight.sizes() == at::IntArrayRef{24, 12 / world});

  train_lm_against_reference(parallel, reference, 14, [&](const at::Tensor& ids, const at::Tensor& target) {
    return at::cross_entropy_loss(parallel->forward(ids).view({-1, 24}), target.view(-1));
  });
}

TEST_CASE("tensor parallel: a head tied to a vocabulary-parallel embedding matches one process", "[tp]") {
  const int world = group().size();
  tp_test::TiedLm reference, parallel;
  const auto whole_ids = cpprun::RowwiseParallel().input_layouts(cpprun::Replicate());
  cpprun::parallelize_module(parallel.ptr(), group(), {{"embed", whole_ids}});
  torch::manual_seed(31);
  const at::Tensor ids = torch::randint(24, {4, 6}), target = torch::randint(24, {4, 6});
  torch::optim::AdamW reference_opt(reference->parameters(), torch::optim::AdamWOptions(1e-2));
  torch::optim::AdamW parallel_opt(parallel->parameters(), torch::optim::AdamWOptions(1e-2));
  for (int step = 0; step < kSteps; ++step) {
    reference_opt.zero_grad();
    const at::Tensor reference_loss =
        at::cross_entropy_loss(reference->forward(ids).flatten(0, 1), target.flatten(), {}, at::Reduction::Mean);
    reference_loss.backward();
    reference_opt.step();
    parallel_opt.zero_grad();
    const at::Tensor logits = parallel->forward(ids);
    CHECK(logits.size(-1) == 24 / world);  // never gathered whole
    const at::Tensor loss = cpprun::vocab_parallel_cross_entropy(logits, target, group()).mean();
    loss.backward();
    parallel_opt.step();
    INFO("step " << step);
    CHECK(relative(loss.item<double>(), reference_loss.item<double>()) <= kTolerance);
  }
  check_full_state(*parallel, *reference);
}

TEST_CASE("tensor parallel: a plan that would break a tied weight is refused, naming both names", "[tp]") {
  struct TiedTwiceImpl : torch::nn::Module {  // "embed.weight" is also "head_weight"
    torch::nn::Embedding embed{nullptr};
    TiedTwiceImpl() {
      embed = register_module("embed", torch::nn::Embedding(24, 12));
      register_parameter("head_weight", embed->weight);
    }
  };
  auto tied = std::make_shared<TiedTwiceImpl>();
  CHECK_THROWS_WITH(cpprun::parallelize_module(tied, group(), {{"embed", cpprun::RowwiseParallel()}}),
                    Catch::Contains("\"embed.weight\" and \"head_weight\" are one tensor") &&
                        Catch::Contains("vocab_parallel_logits"));
  CHECK(tied->named_children()["embed"]->as<torch::nn::EmbeddingImpl>() != nullptr);  // left whole
}

TEST_CASE("tensor parallel: vocab_parallel_cross_entropy's loss and gradient are cross_entropy's", "[tp]") {
  const int world = group().size(), rank = group().rank();
  torch::manual_seed(17);
  const at::Tensor logits = torch::randn({5, 8 * world}, kF64) * 4, target = torch::randint(8 * world, {5});
  at::Tensor full = logits.clone().requires_grad_();
  at::cross_entropy_loss(full, target, {}, at::Reduction::Sum).backward();
  at::Tensor mine = logits.chunk(world, 1)[rank].clone().requires_grad_();
  at::Tensor loss = cpprun::vocab_parallel_cross_entropy(mine, target, group());
  CHECK(relative_difference(loss, at::cross_entropy_loss(logits, target, {}, at::Reduction::None)) <= kTolerance);
  loss.sum().backward();
  CHECK(relative_difference(mine.grad(), full.grad().chunk(world, 1)[rank]) <= kTolerance);

  CHECK_THROWS_WITH(cpprun::vocab_parallel_cross_entropy(mine, target.clamp_max(0) - 1, group()),
                    Catch::Contains("target ids range over [-1, -1]") && Catch::Contains("ignore_index -100 aside"));
  CHECK_THROWS_WITH(cpprun::vocab_parallel_cross_entropy(mine, target.unsqueeze(0), group()),
                    Catch::Contains("need a target of shape"));
}

TEST_CASE("tensor parallel: vocab_parallel_cross_entropy ignores ignore_index rows as cross_entropy does", "[tp]") {
  const int world = group().size(), rank = group().rank();
  torch::manual_seed(19);
  const at::Tensor logits = torch::randn({3, 4, 8 * world}, kF64) * 4;
  at::Tensor target = torch::randint(8 * world, {3, 4});
  target[0][1] = -100, target[2][3] = -100;  // padding, cross_entropy's default ignore_index
  at::Tensor full = logits.clone().requires_grad_();
  const at::Tensor reference = at::cross_entropy_loss(full.flatten(0, 1), target.flatten(), {}, at::Reduction::Mean);
  reference.backward();
  at::Tensor mine = logits.chunk(world, -1)[rank].clone().requires_grad_();
  const at::Tensor per_token = cpprun::vocab_parallel_cross_entropy(mine, target, group());
  CHECK(per_token[0][1].item<double>() == 0);
  const at::Tensor mean = per_token.sum() / (target != -100).sum();
  CHECK(relative(mean.item<double>(), reference.item<double>()) <= kTolerance);
  mean.backward();
  CHECK(relative_difference(mine.grad(), full.grad().chunk(world, -1)[rank]) <= kTolerance);
  CHECK(mine.grad()[2][3].abs().max().item<double>() == 0);
  // Another ignore_index: -100 is then an id outside the vocabulary.
  CHECK_THROWS_WITH(cpprun::vocab_parallel_cross_entropy(mine, target, group(), /*ignore_index=*/7 * world + 7),
                    Catch::Contains("[-100,"));
}

TEST_CASE("tensor parallel: dropout on a shard is its slice of the whole tensor's dropout", "[tp]") {
  const int world = group().size(), rank = group().rank();
  const at::Tensor whole = torch::randn({3, 4 * world, 5}, kF64) + 2;  // no zeros: a zero marks a dropped element
  torch::manual_seed(23);
  const at::Tensor expected = at::dropout(whole, 0.3, /*train=*/true);
  torch::manual_seed(23);
  const at::Tensor mine =
      cpprun::tensor_parallel_dropout(whole.chunk(world, 1)[rank].contiguous(), 0.3, /*train=*/true, group(), 1);
  CHECK(relative_difference(mine, expected.chunk(world, 1)[rank]) <= kTolerance);
  // The generators stay in step: every rank drew the same amount.
  const at::Tensor next = torch::rand({1});
  at::Tensor highest = next.clone(), lowest = next.clone();
  cpprun::all_reduce(group(), highest, cpprun::ReduceOp::kMax);
  cpprun::all_reduce(group(), lowest, cpprun::ReduceOp::kMin);
  CHECK(highest.item<float>() == lowest.item<float>());
  CHECK(cpprun::tensor_parallel_dropout(whole, 0.3, /*train=*/false, group(), 1).equal(whole));

  // As a plan entry: SequenceParallel on a Dropout.
  auto net = torch::nn::Sequential(torch::nn::Dropout(0.5));
  cpprun::parallelize_module(net.ptr(), group(), {{"0", cpprun::SequenceParallel()}});
  REQUIRE(net[0]->as<cpprun::SequenceParallelDropout>() != nullptr);
  torch::manual_seed(29);
  const at::Tensor reference = at::dropout(whole, 0.5, true);
  torch::manual_seed(29);
  CHECK(relative_difference(net->forward(whole.chunk(world, 1)[rank].contiguous()),
                            reference.chunk(world, 1)[rank]) <= kTolerance);
}

// Note [Wildcards in a plan]: "*.0" plans every block's first Linear, as PyTorch's fnmatch keys;
// the result is the explicit plan's, parameter for parameter.
TEST_CASE("tensor parallel: plan keys with wildcards name every submodule they match", "[tp]") {
  const auto blocks = [] {
    torch::manual_seed(7);
    auto block = [] { return torch::nn::Sequential(torch::nn::Linear(4, 12), torch::nn::ReLU(), torch::nn::Linear(12, 4)); };
    return torch::nn::ModuleList(block(), block(), block());
  };
  const auto run = [](const torch::nn::ModuleList& net, torch::Tensor x) {
    for (const auto& block : *net) x = block->as<torch::nn::Sequential>()->forward(x);
    return x;
  };
  auto explicit_net = blocks(), wildcard_net = blocks();
  cpprun::ParallelizePlan explicit_plan;
  for (const char* b : {"0", "1", "2"}) {
    explicit_plan.push_back({std::string(b) + ".0", cpprun::ColwiseParallel()});
    explicit_plan.push_back({std::string(b) + ".2", cpprun::RowwiseParallel()});
  }
  cpprun::parallelize_module(explicit_net.ptr(), group(), explicit_plan);
  cpprun::parallelize_module(wildcard_net.ptr(), group(), {{"*.0", cpprun::ColwiseParallel()}, {"[0-2].2", cpprun::RowwiseParallel()}});
  const auto splits = cpprun::tensor_parallel_splits(*wildcard_net);
  CHECK(splits.size() == cpprun::tensor_parallel_splits(*explicit_net).size());
  CHECK(splits.count("1.0.weight") == 1);
  auto mine = explicit_net->named_parameters();
  for (const auto& item : wildcard_net->named_parameters()) {
    INFO(item.key());
    CHECK(item.value().equal(mine[item.key()]));
  }
  torch::manual_seed(3);  // the same input on every rank, as a replicated input is
  const auto x = torch::randn({2, 4});
  CHECK(torch::allclose(run(wildcard_net, x), run(explicit_net, x)));
  // Matching nothing, or one submodule twice, is refused; the module is left whole.
  auto fresh = blocks();
  CHECK_THROWS_WITH(cpprun::parallelize_module(fresh.ptr(), group(), {{"*.9", cpprun::ColwiseParallel()}}),
                    Catch::Contains("the plan's \"*.9\" matches no submodule: nothing matches \"9\""));
  CHECK_THROWS_WITH(cpprun::parallelize_module(fresh.ptr(), group(),
                                               {{"*.0", cpprun::ColwiseParallel()}, {"1.0", cpprun::ColwiseParallel()}}),
                    Catch::Contains("names \"1.0\" twice (as \"*.0\" and as \"1.0\")"));
  CHECK(fresh[0]->as<torch::nn::Sequential>()->ptr(0)->as<torch::nn::Linear>() != nullptr);
}

namespace {

// Layers kept in a ModuleDict, as torchtitan keeps its blocks; its forward calls them through the
// dict, whatever type each now is.
struct DictNetImpl : torch::nn::Module {
  torch::nn::ModuleDict layers{nullptr};
  DictNetImpl() {
    torch::manual_seed(11);
    torch::OrderedDict<std::string, std::shared_ptr<torch::nn::Module>> children;
    children.insert("fc1", torch::nn::Linear(12, 48).ptr());
    children.insert("fc2", torch::nn::Linear(48, 12).ptr());
    layers = register_module("layers", torch::nn::ModuleDict(children));
    to(at::kDouble);
  }
  static at::Tensor call(const std::shared_ptr<torch::nn::Module>& layer, const at::Tensor& x) {
    if (auto* whole = layer->as<torch::nn::Linear>()) return whole->forward(x);
    if (auto* colwise = layer->as<cpprun::ColwiseParallelLinear>()) return colwise->forward(x);
    return layer->as<cpprun::RowwiseParallelLinear>()->forward(x);
  }
  at::Tensor forward(const at::Tensor& x) { return call(layers["fc2"], at::gelu(call(layers["fc1"], x))); }
};
TORCH_MODULE(DictNet);

}  // namespace

TEST_CASE("tensor parallel: layers held in a ModuleDict are replaced where its forward finds them", "[tp]") {
  const int world = group().size();
  DictNet reference, parallel;
  cpprun::parallelize_module(parallel.ptr(), group(),
                             {{"layers.fc1", cpprun::ColwiseParallel()}, {"layers.fc2", cpprun::RowwiseParallel()}});
  // The dict's own map, which operator[] and iteration read, holds the split layers (it held the
  // whole ones: the forward ran them, and the shards the optimizer held never got a gradient).
  REQUIRE(parallel->layers["fc1"]->as<cpprun::ColwiseParallelLinear>() != nullptr);
  REQUIRE(parallel->layers["fc2"]->as<cpprun::RowwiseParallelLinear>() != nullptr);
  for (const auto& item : *parallel->layers) CHECK(item.value()->as<torch::nn::Linear>() == nullptr);
  CHECK(parallel->layers["fc1"]->as<cpprun::ColwiseParallelLinear>()->weight.size(0) == 48 / world);
  torch::manual_seed(12);
  const at::Tensor x = torch::randn({5, 12}, kF64), target = torch::randn({5, 12}, kF64);
  torch::optim::AdamW reference_opt(reference->parameters(), torch::optim::AdamWOptions(1e-2));
  torch::optim::AdamW parallel_opt(parallel->parameters(), torch::optim::AdamWOptions(1e-2));
  for (int step = 0; step < kSteps; ++step) {
    reference_opt.zero_grad();
    const at::Tensor reference_loss = at::mse_loss(reference->forward(x), target);
    reference_loss.backward();
    reference_opt.step();
    parallel_opt.zero_grad();
    const at::Tensor loss = at::mse_loss(parallel->forward(x), target);
    loss.backward();
    for (const auto& p : parallel->parameters()) CHECK(p.grad().defined());
    parallel_opt.step();
    INFO("step " << step);
    CHECK(relative(loss.item<double>(), reference_loss.item<double>()) <= kTolerance);
  }
  check_full_state(*parallel, *reference);
}

TEST_CASE("tensor parallel: RowwiseParallel() on an Embedding gathers each rank's ids first, as PyTorch's", "[tp]") {
  // Note [An Embedding's ids under RowwiseParallel]: the style's default input_layouts, Shard(-1),
  // says each rank holds its chunk of the ids along the last dimension; the output covers them all.
  const int world = group().size(), rank = group().rank();
  const auto make = [] {  // the same weights each time
    torch::manual_seed(21);
    torch::nn::Sequential net(torch::nn::Embedding(24, 12));
    net->to(at::kDouble);
    return net;
  };
  auto reference = make(), net = make(), net_replicated = make();
  auto* whole = reference[0]->as<torch::nn::Embedding>();
  cpprun::parallelize_module(net.ptr(), group(), {{"0", cpprun::RowwiseParallel()}});
  cpprun::parallelize_module(net_replicated.ptr(), group(),
                             {{"0", cpprun::RowwiseParallel().input_layouts(cpprun::Replicate())}});
  const at::Tensor ids = torch::randint(24, {3, 4 * world});
  const at::Tensor coefficients = torch::randn({3, 4 * world, 12}, kF64);
  const at::Tensor expected = whole->forward(ids);
  (expected * coefficients).sum().backward();

  const at::Tensor out = net->forward(ids.chunk(world, -1)[rank]);
  REQUIRE(out.sizes() == expected.sizes());
  CHECK(relative_difference(out, expected) <= kTolerance);
  (out * coefficients).sum().backward();
  auto* shard = net[0]->as<cpprun::VocabParallelEmbedding>();
  REQUIRE(shard != nullptr);
  CHECK(relative_difference(shard->weight.grad(), whole->weight.grad().chunk(world, 0)[rank]) <= kTolerance);
  // input_layouts(Replicate()): the same ids on every rank, looked up as they are.
  const at::Tensor out_replicated = net_replicated->forward(ids);
  CHECK(relative_difference(out_replicated, expected) <= kTolerance);
}

TEST_CASE("tensor parallel: RowwiseParallel with its output split along the features adds its chunk of the bias",
          "[tp]") {
  const int world = group().size(), rank = group().rank();
  for (const int64_t dim : {int64_t{1}, int64_t{-1}}) {
    INFO("output_layouts Shard(" << dim << ")");
    const auto make = [] {
      torch::manual_seed(23);
      torch::nn::Sequential net(torch::nn::Linear(24, 12));
      net->to(at::kDouble);
      return net;
    };
    auto reference = make(), net = make();
    auto* whole = reference[0]->as<torch::nn::Linear>();
    cpprun::parallelize_module(
        net.ptr(), group(),
        {{"0", cpprun::RowwiseParallel().input_layouts(cpprun::Replicate()).output_layouts(cpprun::Shard(dim))}});
    const at::Tensor x = torch::randn({5, 24}, kF64), coefficients = torch::randn({5, 12}, kF64);
    const at::Tensor expected = whole->forward(x);
    (expected * coefficients).sum().backward();
    const at::Tensor out = net->forward(x);
    CHECK(relative_difference(out, expected.chunk(world, 1)[rank]) <= kTolerance);
    // The whole loss is the sum of every rank's part: the bias's gradient is summed over them.
    (out * coefficients.chunk(world, 1)[rank]).sum().backward();
    auto* layer = net[0]->as<cpprun::RowwiseParallelLinear>();
    CHECK(relative_difference(layer->bias.grad(), whole->bias.grad()) <= kTolerance);
    CHECK(relative_difference(layer->weight.grad(), whole->weight.grad().chunk(world, 1)[rank]) <= kTolerance);
  }
}

TEST_CASE("tensor parallel: bad plans are refused, naming the submodule", "[tp]") {
  const int world = group().size();
  auto mlp = make_mlp();
  CHECK_THROWS_WITH(cpprun::parallelize_module(mlp.ptr(), group(), {{"fc3", cpprun::ColwiseParallel()}}),
                    Catch::Contains("names \"fc3\"") && Catch::Contains("its submodules: \"0\", \"1\", \"2\", \"3\""));
  CHECK_THROWS_WITH(cpprun::parallelize_module(mlp.ptr(), group(), {{"1.inner", cpprun::ColwiseParallel()}}),
                    Catch::Contains("\"1\" has no submodule \"inner\""));
  CHECK_THROWS_WITH(cpprun::parallelize_module(mlp.ptr(), group(), {{"2", cpprun::ColwiseParallel()}}),
                    Catch::Contains("\"2\" is a torch::nn::GELUImpl"));
  CHECK_THROWS_WITH(cpprun::parallelize_module(mlp.ptr(), group(), {{"1", cpprun::SequenceParallel()}}),
                    Catch::Contains("SequenceParallel applies to torch::nn::LayerNorm and torch::nn::Dropout only"));
  CHECK_THROWS_WITH(cpprun::parallelize_module(mlp.ptr(), group(),
                                               {{"1", cpprun::ColwiseParallel()}, {"1", cpprun::RowwiseParallel()}}),
                    Catch::Contains("names \"1\" twice"));
  // A plan with a typo after a good entry changed nothing.
  CHECK_THROWS(cpprun::parallelize_module(mlp.ptr(), group(), {{"1", cpprun::ColwiseParallel()}, {"fc3", cpprun::RowwiseParallel()}}));
  CHECK(mlp[1]->as<torch::nn::Linear>() != nullptr);
  if (world > 1) {  // world + 1 output features never divide by world
    auto odd = torch::nn::Sequential(torch::nn::Linear(4, world + 1));
    CHECK_THROWS_WITH(cpprun::parallelize_module(odd.ptr(), group(), {{"0", cpprun::ColwiseParallel()}}),
                      Catch::Contains("ColwiseParallel on \"0\" splits its output features (" +
                                      std::to_string(world + 1) + ") over the tensor-parallel group's " +
                                      std::to_string(world) + " ranks"));
    CHECK(odd[0]->as<torch::nn::Linear>() != nullptr);
    // Note [One plan on every tensor-parallel rank]: a rank given another plan is refused on every
    // rank (it waited out the group's timeout, the ranks in different collectives).
    const cpprun::ParallelizePlan megatron{{"1", cpprun::ColwiseParallel()}, {"3", cpprun::RowwiseParallel()}};
    const cpprun::ParallelizePlan first_only{{"1", cpprun::ColwiseParallel().output_layouts(cpprun::Replicate())}};
    const auto& mine = group().rank() == world - 1 ? first_only : megatron;
    CHECK_THROWS_WITH(cpprun::parallelize_module(mlp.ptr(), group(), mine),
                      Catch::Contains("were given different plans") &&
                          Catch::Contains("rank 0 {\"1\": ColwiseParallel(Replicate() -> Shard(-1)), \"3\": "
                                          "RowwiseParallel(Shard(-1) -> Replicate())}; rank " +
                                          std::to_string(world - 1) +
                                          " {\"1\": ColwiseParallel(Replicate() -> Replicate())}"));
    CHECK(mlp[1]->as<torch::nn::Linear>() != nullptr);
  }
  // A deferred model has no values to cut: materialised first, it parallelizes as the eager one.
  auto deferred = cpprun::deferred_init([] { return make_mlp(); });
  CHECK_THROWS_WITH(cpprun::parallelize_module(deferred.ptr(), group(), {{"1", cpprun::ColwiseParallel()}}),
                    Catch::Contains("\"1.weight\" is a deferred parameter") &&
                        Catch::Contains("materialize(model) first"));
  cpprun::materialize(deferred);
  cpprun::parallelize_module(deferred.ptr(), group(), {{"1", cpprun::ColwiseParallel()}});
  auto eager = make_mlp();
  cpprun::parallelize_module(eager.ptr(), group(), {{"1", cpprun::ColwiseParallel()}});
  CHECK(torch::equal(deferred[1]->as<cpprun::ColwiseParallelLinear>()->weight,
                     eager[1]->as<cpprun::ColwiseParallelLinear>()->weight));
}
