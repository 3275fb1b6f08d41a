// HSDP (FullyShardedDataParallel(net, mesh, options)): FullyShardedDataParallel sharded over one mesh dimension and
// replicated over the other, under `cpprun`. At 4 ranks the mesh is 2 replicas x 2 shards; across
// two cpprun agents (tests/dist/hsdp_two_nodes.sh) it is node_local_mesh()'s {node, local}; at 1-3
// ranks the degenerate meshes 1 x N (plain FSDP) and N x 1 (every rank a full replica). Each rank
// trains on its slice of every global batch beside a reference model trained in one process on
// the whole batch; parameters must match, in float64 (Note [Parity in float64] in parity_checks.h).
// CHECK, not REQUIRE, keeps the ranks' collectives in step.
#include "catch.h"
#include <torch/torch.h>
#include <unistd.h>  // getpid

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "cpprun/cpprun.h"
#include "ddp_test_models.h"
#include "dist_test_support.h"
#include "parity_checks.h"
#include "parity_training.h"

using namespace ddp_test;

namespace {

using dist_test::group;
using dist_test::slice;

constexpr int64_t kGlobalBatch = 24;

// The meshes this job tests (made once: each is collective and creates subgroups).
const std::vector<cpprun::DeviceMesh>& meshes() {
  static const std::vector<cpprun::DeviceMesh> all = [] {
    const int world = group().size();
    std::vector<cpprun::DeviceMesh> out;
    if (group().env().local_world_size < world) {
      out.push_back(cpprun::node_local_mesh(group()));  // several nodes: shard within, replicate across
    } else if (world == 4) {
      out.emplace_back(group(), std::vector<int>{2, 2}, std::vector<std::string>{"replicate", "shard"});
    } else {
      out.emplace_back(group(), std::vector<int>{1, world}, std::vector<std::string>{"replicate", "shard"});
      out.emplace_back(group(), std::vector<int>{world, 1}, std::vector<std::string>{"replicate", "shard"});
    }
    for (const auto& mesh : out) {  // what the test ran on, for hsdp_two_nodes.sh to check
      std::printf("hsdp: mesh %dx%d (%s, %s)\n", mesh.size(0), mesh.size(1), mesh.names()[0].c_str(),
                  mesh.names()[1].c_str());
    }
    return out;
  }();
  return all;
}

// One training step of `model` on this rank's slice, returning clip_grad_norm's norm (nothing is
// clipped), and of `ref` on the whole batch, returning its gradients' norm.
template <typename Model>
std::pair<double, double> step_both(Model& model, torch::optim::Optimizer& opt, Mlp& ref, torch::optim::Optimizer& ref_opt,
                                    int step) {
  const int rank = group().rank(), world = group().size();
  auto x = inputs_for("mlp", kGlobalBatch, step);
  auto y = targets_for(kGlobalBatch, step);
  opt.zero_grad();
  torch::nn::functional::cross_entropy(model->forward(slice(x, rank, world)), slice(y, rank, world)).backward();
  const double norm = model->clip_grad_norm(1e9);
  opt.step();
  ref_opt.zero_grad();
  torch::nn::functional::cross_entropy(ref.forward(x), y).backward();
  const double ref_norm = torch::nn::utils::clip_grad_norm_(ref.parameters(), 1e9);
  ref_opt.step();
  return {norm, ref_norm};
}

void check_parity(const cpprun::DeviceMesh& mesh, const cpprun::FsdpOptions& options, const std::string& optimizer,
                  int steps = 4) {
  INFO("mesh " << mesh.size(0) << "x" << (mesh.ndim() == 2 ? mesh.size(1) : 1) << " shard_dim '" << options.shard_dim()
               << "' stage "
               << options.stage() << " optimizer " << optimizer << " limit " << options.gathered_unit_limit()
               << " prefetch " << options.prefetch() << " reshard_after_forward " << options.reshard_after_forward()
               << " cpu_offload " << options.cpu_offload());
  Float64Parity float64;
  torch::manual_seed(100 + group().rank());  // rank 0's initial weights must win
  auto net = std::make_shared<Mlp>(31);
  auto model = cpprun::FullyShardedDataParallel(net, mesh, options);
  auto ref = std::make_shared<Mlp>(31);
  copy_state(*ref, *net);
  auto opt = make_optimizer(optimizer, model->parameters());
  auto ref_opt = make_optimizer(optimizer, ref->parameters());

  // Sharded over the shard dimension only: the shard group's rows make up every parameter once.
  const std::string shard_dim = options.shard_dim().empty() ? mesh.names().back() : options.shard_dim();
  at::Tensor held = at::zeros({1}, at::kLong);
  int64_t total = 0;
  for (const auto& shard : model->parameters()) held += shard.numel();
  for (const auto& p : net->parameters()) total += p.numel();
  cpprun::all_reduce(mesh.group(shard_dim), held);
  CHECK(held.item<int64_t>() == total);

  for (int step = 0; step < steps; ++step) {
    const auto [norm, ref_norm] = step_both(model, *opt, *ref, *ref_opt, step);
    INFO("step " << step << " norm " << norm << " reference " << ref_norm);
    CHECK(std::abs(norm - ref_norm) <= kParityTolerance * ref_norm);
  }
  model->gather_full_parameters();
  check_same_parameters(*net, *ref, kParityTolerance);
}

cpprun::FsdpOptions hsdp(int stage) { return cpprun::FsdpOptions().stage(stage).wrap_policy(is_linear); }

// Whether any of this rank's shards has a gradient (zero_grad() sets them to none).
bool any_shard_grad(torch::nn::Module& model) {
  for (const auto& p : model.parameters()) {
    if (p.grad().defined()) return true;
  }
  return false;
}

}  // namespace

TEST_CASE("hsdp: ZeRO-1, -2 and -3 over a replicate x shard mesh match one process, SGD-momentum and AdamW", "[hsdp]") {
  for (const auto& mesh : meshes()) {
    for (int stage : {1, 2, 3}) {
      check_parity(mesh, hsdp(stage), "sgd");
      check_parity(mesh, hsdp(stage), "adamw");
    }
  }
}

TEST_CASE("hsdp: every ZeRO-3 option, and sharding over the first mesh dimension, match one process", "[hsdp]") {
  for (const auto& mesh : meshes()) {
    check_parity(mesh, hsdp(3).reshard_after_forward(false), "adamw");
    check_parity(mesh, hsdp(3).prefetch(false).gathered_unit_limit(1), "adamw");
    check_parity(mesh, hsdp(3).cpu_offload(true), "adamw");
    check_parity(mesh, hsdp(3).auto_wrap_min_params(0).wrap_policy(nullptr), "sgd");  // the model as one unit
    check_parity(mesh, hsdp(2).shard_dim(mesh.names()[0]), "adamw");
  }
}

TEST_CASE("hsdp: a sharded checkpoint is written by the first replica and loads into every replica and into plain FSDP",
          "[hsdp]") {
  Float64Parity float64;
  const int rank = group().rank();
  const cpprun::DeviceMesh& mesh = meshes().front();
  // One directory for the job, named by rank 0 (the nodes' agents differ).
  at::Tensor id = at::tensor(static_cast<int64_t>(::getpid()));
  cpprun::broadcast(group(), id, 0);
  const std::string dir = "/tmp/cpprun_hsdp_ckpt_" + std::to_string(id.item<int64_t>());

  auto initial = std::make_shared<Mlp>(31);  // rank 0's initial weights, for the references
  {
    torch::manual_seed(100 + rank);
    auto net = std::make_shared<Mlp>(31);
    auto model = cpprun::FullyShardedDataParallel(net, mesh, hsdp(3));  // rank 0's weights everywhere
    copy_state(*initial, *net);
    auto ref = std::make_shared<Mlp>(31);
    copy_state(*ref, *net);
    auto ref_opt = make_optimizer("adamw", ref->parameters());
    auto opt = make_optimizer("adamw", model->parameters());
    for (int step = 0; step < 3; ++step) step_both(model, *opt, *ref, *ref_opt, step);
    cpprun::save_sharded_checkpoint(model, *opt, dir);
  }
  // The files of plain FSDP over the shard group: one per shard rank, from the first replica.
  int rank_files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    rank_files += entry.path().filename().string().rfind("rank_", 0) == 0 ? 1 : 0;
  }
  CHECK(rank_files == mesh.size(1));
  CHECK(std::filesystem::exists(dir + "/meta.pt"));

  // Into HSDP (every replica reads the same shards) and into plain FSDP over every rank; both
  // then go on training as the reference does.
  auto resume = [&](bool hybrid, const cpprun::FsdpOptions& options) {
    torch::manual_seed(999 + rank);  // loading must overwrite these weights
    auto net = std::make_shared<Mlp>(31);
    auto model = hybrid ? cpprun::FullyShardedDataParallel(net, mesh, options)
                        : cpprun::FullyShardedDataParallel(net, group(), options);
    auto opt = make_optimizer("adamw", model->parameters());
    cpprun::load_sharded_checkpoint(model, *opt, dir);
    auto ref = std::make_shared<Mlp>(31);
    copy_state(*ref, *initial);
    auto ref_opt = make_optimizer("adamw", ref->parameters());
    for (int step = 0; step < 3; ++step) {
      ref_opt->zero_grad();
      torch::nn::functional::cross_entropy(ref->forward(inputs_for("mlp", kGlobalBatch, step)),
                                           targets_for(kGlobalBatch, step)).backward();
      ref_opt->step();
    }
    for (int step = 3; step < 5; ++step) step_both(model, *opt, *ref, *ref_opt, step);
    model->gather_full_parameters();
    check_same_parameters(*net, *ref, kParityTolerance);
  };
  resume(true, hsdp(3));
  resume(true, hsdp(1));
  resume(false, cpprun::FsdpOptions().stage(2).wrap_policy(is_linear));
  // Units are no part of the file: the whole model as one unit loads it as well.
  resume(false, cpprun::FsdpOptions().stage(3));
  cpprun::barrier(group());
  if (rank == 0) std::filesystem::remove_all(dir);
}

TEST_CASE("hsdp: a 1-D mesh is plain FSDP; a shard_dim naming no dimension, or without a mesh, is a clear error",
          "[hsdp]") {
  auto net = std::make_shared<Mlp>(31);
  CHECK_THROWS_WITH(cpprun::FullyShardedDataParallel(net, group(), cpprun::FsdpOptions().shard_dim("shard")),
                    Catch::Matchers::Contains("but FSDP was given a group"));
  const cpprun::DeviceMesh& mesh = meshes().front();
  CHECK_THROWS_WITH(cpprun::FullyShardedDataParallel(net, mesh, hsdp(2).shard_dim("rows")),
                    Catch::Matchers::Contains("rows"));
  const cpprun::DeviceMesh flat(group(), {group().size()}, {"shard"});
  check_parity(flat, hsdp(3), "adamw");
}

// FSDP2's set_requires_all_reduce(false) (foreach_reduce with all_reduce_grads false): the shard
// group's reduction runs, its result waits, summed, beside the shards' gradients (which stay
// unset) rather than crossing the replicas; the next all-reducing backward adds it in, so that
// after the step every replica holds what one process on the whole batch computes.
TEST_CASE("hsdp: set_requires_all_reduce(false) sets the shard group's reduction aside; the next all-reduce adds it in",
          "[hsdp]") {
  const int rank = group().rank(), world = group().size();
  for (const auto& mesh : meshes()) {
    for (int stage : {1, 2, 3}) {
      INFO("mesh " << mesh.size(0) << "x" << mesh.size(1) << " stage " << stage);
      Float64Parity float64;
      torch::manual_seed(100 + rank);  // rank 0's initial weights must win
      auto net = std::make_shared<Mlp>(31);
      auto model = cpprun::FullyShardedDataParallel(net, mesh, hsdp(stage));
      auto ref = std::make_shared<Mlp>(31);
      copy_state(*ref, *net);
      torch::optim::SGD opt(model->parameters(), 0.1), ref_opt(ref->parameters(), 0.1);
      for (int step = 0; step < 2; ++step) {
        opt.zero_grad();
        ref_opt.zero_grad();
        // Micro-batch 0 local, 1 and 2 reduced in the shard group only, 3 all-reduced too.
        for (int micro = 0; micro < 4; ++micro) {
          INFO("step " << step << " micro-batch " << micro);
          if (micro == 0) model->set_requires_gradient_sync(false);
          if (micro == 1) {
            model->set_requires_gradient_sync(true);
            model->set_requires_all_reduce(false);
          }
          if (micro == 3) model->set_requires_all_reduce(true);
          auto x = inputs_for("mlp", kGlobalBatch, 10 * step + micro);
          auto y = targets_for(kGlobalBatch, 10 * step + micro);
          torch::nn::functional::cross_entropy(model->forward(slice(x, rank, world)), slice(y, rank, world)).backward();
          // Every 2-D mesh has a replicate group, of one rank in a 1 x N mesh (as FSDP2's HSDP).
          CHECK(any_shard_grad(*model) == (micro == 3));
          reference_backward([&](torch::Tensor in) { return ref->forward(in); }, x, y, world);
        }
        opt.step();
        ref_opt.step();
      }
      model->gather_full_parameters();
      check_same_parameters(*net, *ref, kParityTolerance);
      // set_requires_gradient_sync(true) turns the all-reduce back on too, as FSDP2's.
      opt.zero_grad();
      model->set_requires_all_reduce(false);
      model->set_requires_gradient_sync(true);
      torch::nn::functional::cross_entropy(model->forward(slice(inputs_for("mlp", kGlobalBatch, 50), rank, world)),
                                           slice(targets_for(kGlobalBatch, 50), rank, world))
          .backward();
      CHECK(any_shard_grad(*model));
      // A no_sync guard puts back both halves of the setting it found: set_requires_gradient_sync(false)
      // inside it turned the all-reduce off too, and the guard's end left it off (the next
      // backward set its reduction aside, and the step went without it).
      opt.zero_grad();
      {
        auto guard = model->no_sync();
        model->set_requires_gradient_sync(false);
      }
      torch::nn::functional::cross_entropy(model->forward(slice(inputs_for("mlp", kGlobalBatch, 51), rank, world)),
                                           slice(targets_for(kGlobalBatch, 51), rank, world))
          .backward();
      CHECK(any_shard_grad(*model));
    }
  }
  // Plain FSDP (a group, or a 1-D mesh) has no all-reduce to skip: reduced is reduced, as FSDP2's.
  auto model = cpprun::FullyShardedDataParallel(std::make_shared<Mlp>(31), group(), hsdp(2));
  model->set_requires_all_reduce(false);
  torch::nn::functional::cross_entropy(model->forward(slice(inputs_for("mlp", kGlobalBatch, 0), rank, world)),
                                       slice(targets_for(kGlobalBatch, 0), rank, world))
      .backward();
  CHECK(any_shard_grad(*model));
}
