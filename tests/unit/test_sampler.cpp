// DistributedSampler: the same indices as PyTorch's Python DistributedSampler (vectors generated
// by tests/data/make_sampler_indices.py with PyTorch 2.15), and its C++ behaviour.
#include "catch.h"
#include <torch/torch.h>

#include <fstream>
#include <set>
#include <sstream>

#include "cpprun/sampler.h"

namespace {

std::vector<size_t> drain(cpprun::DistributedSampler& sampler, size_t batch_size) {
  std::vector<size_t> all;
  while (auto batch = sampler.next(batch_size)) all.insert(all.end(), batch->begin(), batch->end());
  return all;
}

cpprun::DistributedSamplerOptions on(int64_t replicas, int64_t rank) {
  return cpprun::DistributedSamplerOptions().num_replicas(replicas).rank(rank);
}

// A dataset whose examples are their own indices.
struct Indices : torch::data::datasets::Dataset<Indices, int64_t> {
  size_t n;
  explicit Indices(size_t n) : n(n) {}
  int64_t get(size_t index) override { return static_cast<int64_t>(index); }
  torch::optional<size_t> size() const override { return n; }
};

}  // namespace

TEST_CASE("sampler: indices equal PyTorch's DistributedSampler", "[sampler]") {
  std::ifstream file(CPPRUN_TEST_DATA_DIR "/sampler_indices.txt");
  REQUIRE(file.good());
  std::string line;
  int checked = 0;
  while (std::getline(file, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream in(line);
    size_t size, epoch;
    int64_t replicas, rank, seed;
    int shuffle, drop_last;
    std::string colon;
    in >> size >> replicas >> rank >> shuffle >> seed >> drop_last >> epoch >> colon;
    std::vector<size_t> expected;
    for (size_t i; in >> i;) expected.push_back(i);

    auto options = on(replicas, rank).shuffle(shuffle).seed(seed).drop_last(drop_last);
    cpprun::DistributedSampler sampler(size, options);
    sampler.set_epoch(epoch);
    sampler.reset();
    INFO(line.substr(0, line.find(':')));
    CHECK(sampler.size() == expected.size());
    CHECK(drain(sampler, 5) == expected);
    ++checked;
  }
  CHECK(checked == 1920);
}

TEST_CASE("sampler: ranks partition the indices", "[sampler]") {
  for (size_t size : {10, 13}) {
    for (bool drop_last : {false, true}) {
      std::multiset<size_t> seen;
      for (int64_t rank = 0; rank < 4; ++rank) {
        auto indices = cpprun::distributed_indices(size, on(4, rank).seed(7).drop_last(drop_last), 3);
        seen.insert(indices.begin(), indices.end());
      }
      std::set<size_t> distinct(seen.begin(), seen.end());
      INFO("size " << size << " drop_last " << drop_last);
      if (drop_last) {
        CHECK(seen.size() == size / 4 * 4);  // disjoint, the tail dropped
        CHECK(distinct.size() == seen.size());
      } else {
        CHECK(distinct.size() == size);  // all covered, padded by repetition
        CHECK(seen.size() == (size + 3) / 4 * 4);
      }
    }
  }
}

TEST_CASE("sampler: each pass is a new epoch even without set_epoch", "[sampler]") {
  cpprun::DistributedSampler sampler(100, on(2, 1));
  sampler.reset();
  auto first = drain(sampler, 8);
  sampler.reset();
  auto second = drain(sampler, 8);
  CHECK(first == cpprun::distributed_indices(100, on(2, 1), 0));
  CHECK(second == cpprun::distributed_indices(100, on(2, 1), 1));
  CHECK(first != second);
  CHECK(sampler.epoch() == 1);
}

TEST_CASE("sampler: indices() follows set_epoch, as PyTorch's iter(sampler) does", "[sampler]") {
  cpprun::DistributedSampler sampler(9, on(2, 0));
  CHECK(sampler.indices() == cpprun::distributed_indices(9, on(2, 0), 0));
  sampler.set_epoch(3);  // before any pass: epoch 3's, not the constructor's epoch 0
  CHECK(sampler.epoch() == 3);
  CHECK(sampler.indices() == cpprun::distributed_indices(9, on(2, 0), 3));
  sampler.reset();
  const auto head = *sampler.next(2);
  sampler.set_epoch(5);  // mid-pass: the pass keeps its order; indices() is the next pass's
  CHECK(sampler.indices() == cpprun::distributed_indices(9, on(2, 0), 5));
  std::vector<size_t> rest = head;
  while (auto batch = sampler.next(2)) rest.insert(rest.end(), batch->begin(), batch->end());
  CHECK(rest == cpprun::distributed_indices(9, on(2, 0), 3));
  sampler.reset();
  CHECK(drain(sampler, 2) == cpprun::distributed_indices(9, on(2, 0), 5));
  CHECK(sampler.indices() == cpprun::distributed_indices(9, on(2, 0), 5));
}

TEST_CASE("sampler: set_epoch on your copy reaches the data loader's", "[sampler]") {
  cpprun::DistributedSampler sampler(40, on(2, 0));
  auto loader = torch::data::make_data_loader(Indices(40), sampler, torch::data::DataLoaderOptions(6));
  for (uint64_t epoch : {3u, 3u, 8u}) {
    sampler.set_epoch(epoch);
    std::vector<size_t> got;
    for (auto& batch : *loader) {
      for (auto v : batch) got.push_back(static_cast<size_t>(v));
    }
    INFO("epoch " << epoch);
    CHECK(got == cpprun::distributed_indices(40, on(2, 0), epoch));
  }
}

TEST_CASE("sampler: save and load resume mid-epoch", "[sampler]") {
  cpprun::DistributedSampler sampler(50, on(3, 2).seed(9));
  sampler.set_epoch(4);
  sampler.reset();
  auto expected = sampler.indices();
  auto head = *sampler.next(5);
  torch::serialize::OutputArchive out;
  sampler.save(out);
  std::ostringstream bytes;
  out.save_to(bytes);

  cpprun::DistributedSampler restored(50, on(3, 2).seed(9));
  torch::serialize::InputArchive in;
  std::istringstream source(bytes.str());
  in.load_from(source);
  restored.load(in);
  CHECK(restored.epoch() == 4);
  CHECK(restored.indices() == expected);  // the loaded epoch's, before the pass
  restored.reset();  // what the loader's begin() does
  auto rest = drain(restored, 4);
  head.insert(head.end(), rest.begin(), rest.end());
  CHECK(head == expected);
  CHECK(restored.epoch() == 4);

  cpprun::DistributedSampler other(51, on(3, 2).seed(9));
  std::istringstream again(bytes.str());
  torch::serialize::InputArchive in2;
  in2.load_from(again);
  CHECK_THROWS_WITH(other.load(in2), Catch::Contains("another dataset size"));
}

TEST_CASE("sampler: bad options are refused", "[sampler]") {
  CHECK_THROWS_WITH(cpprun::DistributedSampler(10, on(2, 2)), Catch::Contains("rank 2 is not in [0, num_replicas - 1]"));
  CHECK_THROWS_WITH(cpprun::DistributedSampler(10, on(0, 0)), Catch::Contains("num_replicas must be at least 1"));
}
