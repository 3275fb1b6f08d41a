// Subgroups (new_group, split_group) under `cpprun --nproc_per_node=K`, K = 1..4:
// collectives on disjoint subgroups at once, clear errors for non-members and disagreeing
// creation, the ranks get_process_group_ranks lists, and DDP / FSDP / DistributedSampler on a
// subgroup matching one process.
#include "catch.h"
#include <torch/torch.h>

#include <algorithm>
#include <functional>
#include <numeric>
#include <set>

#include "cpprun/cpprun.h"
#include "cpprun/object_collectives.h"
#include "dist_test_support.h"
#include "ddp_test_models.h"
#include "parity_checks.h"

using dist_test::group;
using dist_test::slice;

namespace {

// The even and the odd ranks: what every rank computes alike.
std::vector<int> ranks_with_parity(int parity, int world) {
  std::vector<int> ranks;
  for (int r = parity; r < world; r += 2) ranks.push_back(r);
  return ranks;
}

// The subgroup of this rank's parity, made by new_group on every rank (evens first).
cpprun::ProcessGroup parity_group() {
  const int world = group().size();
  auto evens = cpprun::new_group(group(), ranks_with_parity(0, world));
  if (world == 1) return evens;
  auto odds = cpprun::new_group(group(), ranks_with_parity(1, world));
  return group().rank() % 2 == 0 ? evens : odds;
}

}  // namespace

TEST_CASE("subgroups: disjoint groups reduce at once, each its own members' values", "[subgroups]") {
  const int world = group().size(), rank = group().rank();
  auto mine = parity_group();
  REQUIRE(mine.is_member());
  const auto members = ranks_with_parity(rank % 2, world);
  CHECK(mine.size() == static_cast<int>(members.size()));
  CHECK(mine.rank() == rank / 2);
  // Both groups' all-reduces and all-gathers are in flight together.
  at::Tensor sum = at::full({1001}, static_cast<float>(rank + 1));
  auto reduce = cpprun::all_reduce_async(mine, sum);
  at::Tensor gathered = at::empty({mine.size() * 3}, at::kLong);
  auto gather = cpprun::all_gather_into_async(mine, gathered, at::full({3}, rank, at::kLong));
  reduce.wait();
  gather.wait();
  float expected = 0;
  std::vector<at::Tensor> parts;
  for (int r : members) {
    expected += r + 1;
    parts.push_back(at::full({3}, r, at::kLong));
  }
  CHECK(sum.equal(at::full({1001}, expected)));
  CHECK(gathered.equal(at::cat(parts)));
  cpprun::barrier(group());
}

TEST_CASE("subgroups: a non-member's collective on the group is a clear error", "[subgroups]") {
  const int world = group().size(), rank = group().rank();
  auto first = cpprun::new_group(group(), {0});
  CHECK(first.is_member() == (rank == 0));
  if (rank != 0) {
    CHECK(first.rank() == -1);
    at::Tensor t = at::ones({2});
    CHECK_THROWS_WITH(cpprun::all_reduce(first, t),
                      Catch::Contains("is not a member of this subgroup (ranks 0)") && Catch::Contains("is_member()"));
    CHECK_THROWS_WITH(cpprun::barrier(first), Catch::Contains("not a member"));
  } else {
    at::Tensor t = at::ones({2});
    cpprun::all_reduce(first, t);  // a group of one
    CHECK(t.equal(at::ones({2})));
  }
  CHECK_THROWS_WITH(cpprun::new_group(group(), {0, world}), Catch::Contains("is not a rank of the parent group"));
  CHECK_THROWS_WITH(cpprun::new_group(group(), {0, 0}), Catch::Contains("listed twice"));
}

// As PyTorch (distributed_c10d.py get_rank / get_world_size: -1 for a group the rank is not in;
// DistributedDataParallel refuses GroupMember.NON_GROUP_MEMBER): a non-member's group reports -1,
// and what trains over a group refuses it, naming the group's ranks and this rank. DDP on such a
// group once trained this rank alone (its size was the members' count, 1).
TEST_CASE("subgroups: a non-member's size is -1 and the wrappers refuse its group", "[subgroups][ddp][fsdp]") {
  const int rank = group().rank();
  auto first = cpprun::new_group(group(), {0});
  if (rank == 0) {
    CHECK(first.size() == 1);
    return;
  }
  CHECK(first.size() == -1);
  CHECK(first.rank() == -1);
  CHECK(cpprun::get_process_group_ranks(first).empty());
  // Each refusal names what refused, the group's ranks, this rank, and is_member().
  const auto refused = [&](const std::string& what, const std::function<void()>& make) {
    std::string message = "(no error)";
    try {
      make();
    } catch (const std::exception& e) {
      message = e.what();
    }
    CHECK_THAT(message, Catch::StartsWith("cpprun::" + what + ": ") &&
                            Catch::Contains("is not a member of this subgroup (ranks 0)") &&
                            Catch::Contains("(rank " + std::to_string(rank) + " of the group") &&
                            Catch::Contains("is_member()"));
  };
  refused("DistributedDataParallel", [&] { (void)cpprun::DistributedDataParallel(std::make_shared<ddp_test::Mlp>(), first); });
  refused("FullyShardedDataParallel", [&] {
    (void)cpprun::FullyShardedDataParallel(std::make_shared<ddp_test::Mlp>(), first, cpprun::FsdpOptions().stage(3));
  });
  refused("DistributedSampler", [&] { (void)cpprun::DistributedSampler(10, first); });
  refused("SyncBatchNorm", [&] { (void)cpprun::SyncBatchNorm(4, first); });
  refused("GradScaler", [&] { cpprun::GradScaler scaler(first); });
  refused("DeviceMesh", [&] { (void)cpprun::DeviceMesh(first, {1}); });
}

TEST_CASE("subgroups: ranks that create different groups, or in another order, all get one error", "[subgroups]") {
  const int world = group().size(), rank = group().rank();
  if (world == 1) return;
  // Rank 0 asks for {0}, the others for {0, 1}.
  std::vector<int> ranks = rank == 0 ? std::vector<int>{0} : std::vector<int>{0, 1};
  CHECK_THROWS_WITH(cpprun::new_group(group(), ranks),
                    Catch::Contains("ranks disagree on creating a subgroup: rank 0 called new_group([0])") &&
                        Catch::Contains("rank 1 called new_group([0, 1])"));
  // Rank 0 splits where the others make a new group.
  if (rank == 0) {
    CHECK_THROWS_WITH(cpprun::split_group(group(), 0), Catch::Contains("rank 0 called split_group(colour 0, key 0)"));
  } else {
    CHECK_THROWS_WITH(cpprun::new_group(group(), {0, 1}), Catch::Contains("rank 0 called split_group(colour 0, key 0)"));
  }
  // Agreement afterwards works again.
  auto all = cpprun::new_group(group(), std::vector<int>(ranks_with_parity(0, world)));
  CHECK(all.is_member() == (rank % 2 == 0));
}

TEST_CASE("subgroups: split_group by colour, ordered by key", "[subgroups]") {
  const int world = group().size(), rank = group().rank();
  // Colour: rank / 2 (pairs); key: -rank, so the higher rank of a pair is its rank 0.
  auto pair = cpprun::split_group(group(), rank / 2, -rank);
  const int first = (rank / 2) * 2;
  const int size = std::min(2, world - first);
  CHECK(pair.size() == size);
  CHECK(pair.rank() == (size == 2 ? 1 - (rank - first) : 0));
  at::Tensor t = at::full({1}, rank, at::kLong);
  cpprun::broadcast(pair, t, 0);  // from the pair's highest rank
  CHECK(t.item<int64_t>() == first + size - 1);
  // kNoColour: rank 0 joins nothing.
  auto rest = cpprun::split_group(group(), rank == 0 ? cpprun::kNoColour : 0);
  CHECK(rest.is_member() == (rank != 0));
  if (rank != 0) CHECK(rest.size() == world - 1);
}

TEST_CASE("subgroups: DDP and ZeRO-3 on a subgroup match one process on the group's batch", "[subgroups][ddp][fsdp]") {
  const int rank = group().rank();
  auto mine = parity_group();
  const int world = mine.size(), sub_rank = mine.rank();
  constexpr int64_t kBatch = 12;
  ddp_test::Float64Parity float64;  // See Note [Parity in float64]
  for (const std::string mode : {"ddp", "zero3"}) {
    torch::manual_seed(100 + rank);  // rank 0 of each group's weights must win
    auto net = std::make_shared<ddp_test::Mlp>();
    auto ref = std::make_shared<ddp_test::Mlp>();
    std::shared_ptr<torch::nn::Module> wrapper;
    std::function<torch::Tensor(torch::Tensor)> forward;
    std::vector<torch::Tensor> params;
    if (mode == "ddp") {
      auto ddp = cpprun::DistributedDataParallel(net, mine);
      forward = [ddp](torch::Tensor x) mutable { return ddp->forward(x); };
      params = ddp->parameters();
      wrapper = ddp.ptr();
    } else {
      auto fsdp = cpprun::FullyShardedDataParallel(net, mine, cpprun::FsdpOptions().stage(3));
      forward = [fsdp](torch::Tensor x) mutable { return fsdp->forward(x); };
      params = fsdp->parameters();
      wrapper = fsdp.ptr();
    }
    ddp_test::copy_state(*ref, *net);  // DDP broadcast / FSDP sharded from the group's rank 0
    torch::optim::SGD opt(params, torch::optim::SGDOptions(0.05).momentum(0.9));
    torch::optim::SGD ref_opt(ref->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    for (int step = 0; step < 4; ++step) {
      // Each group trains on data of its own (seeded by parity).
      auto x = ddp_test::inputs_for("mlp", kBatch, 10 * step + rank % 2);
      auto y = ddp_test::targets_for(kBatch, 10 * step + rank % 2);
      opt.zero_grad();
      torch::nn::functional::cross_entropy(forward(slice(x, sub_rank, world)), slice(y, sub_rank, world)).backward();
      opt.step();
      ref_opt.zero_grad();
      torch::nn::functional::cross_entropy(ref->forward(x), y).backward();
      ref_opt.step();
    }
    if (mode == "zero3") {
      auto fsdp = std::dynamic_pointer_cast<cpprun::FullyShardedDataParallelImpl<ddp_test::Mlp>>(wrapper);
      REQUIRE(fsdp);
      fsdp->gather_full_parameters();
    }
    auto ref_params = ref->named_parameters();
    for (const auto& item : net->named_parameters()) {
      const double diff = ddp_test::relative_difference(item.value(), ref_params[item.key()]);
      INFO(mode << " parameter " << item.key() << " relative difference " << diff);
      CHECK(diff <= ddp_test::kParityTolerance);
    }
  }
}

TEST_CASE("subgroups: DistributedSampler on a subgroup partitions among its members", "[subgroups][sampler]") {
  auto mine = parity_group();
  cpprun::DistributedSampler sampler(103, mine, /*shuffle=*/true);
  sampler.set_epoch(2);
  std::vector<int64_t> indices(sampler.indices().begin(), sampler.indices().end());
  auto everyone = cpprun::all_gather_object(mine, indices);
  std::set<int64_t> covered;
  std::size_t total = 0;
  for (const auto& part : everyone) {
    CHECK(part.size() == indices.size());  // equal shares (padded)
    covered.insert(part.begin(), part.end());
    total += part.size();
  }
  CHECK(covered.size() == 103);
  CHECK(total >= 103);
  CHECK(total < 103 + static_cast<std::size_t>(mine.size()));
}

TEST_CASE("subgroups: new_group(ranks) takes the default group's ranks; get_process_group_ranks lists the job's", "[subgroups]") {
  const int world = group().size(), rank = group().rank();  // group() is the default group
  std::vector<int> everyone(world);
  std::iota(everyone.begin(), everyone.end(), 0);
  CHECK(cpprun::get_process_group_ranks(group()) == everyone);
  // Every second rank from the highest down, given in descending order: the group orders them.
  std::vector<int> members;
  for (int r = world - 1; r >= 0; r -= 2) members.push_back(r);
  auto sub = cpprun::new_group(members);
  std::sort(members.begin(), members.end());
  const auto place = std::find(members.begin(), members.end(), rank);
  const bool member = place != members.end();
  REQUIRE(sub.is_member() == member);
  if (!member) {
    CHECK(cpprun::get_process_group_ranks(sub).empty());
    return;
  }
  CHECK(cpprun::get_process_group_ranks(sub) == members);
  CHECK(sub.rank() == place - members.begin());
  // A collective on it sums its members' values only.
  at::Tensor sum = at::full({1}, rank + 1, at::kLong);
  cpprun::all_reduce(sub, sum);
  int64_t expected = 0;
  for (int r : members) expected += r + 1;
  CHECK(sum.item<int64_t>() == expected);
  // A subgroup of the subgroup: its last member alone, named by its rank in the job.
  auto last = cpprun::new_group(sub, {sub.size() - 1});
  CHECK(cpprun::get_process_group_ranks(last) ==
        (rank == members.back() ? std::vector<int>{members.back()} : std::vector<int>{}));
  // split_group lists its ranks in the group's order (by key): here the higher rank of each pair first.
  auto pair = cpprun::split_group(sub, sub.rank() / 2, -sub.rank());
  const int first = (sub.rank() / 2) * 2;
  std::vector<int> pair_ranks;
  for (int r = std::min(first + 1, sub.size() - 1); r >= first; --r) pair_ranks.push_back(members[r]);
  CHECK(cpprun::get_process_group_ranks(pair) == pair_ranks);
}
