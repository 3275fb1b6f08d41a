// broadcast_object / all_gather_object for strings, vectors, plain structs, torch::serialize
// archives and a user's own codec, under `cpprun --nproc_per_node=K` for K = 1..4.
#include "catch.h"
#include <torch/torch.h>

#include <string>
#include <vector>

#include "cpprun/cpprun.h"
#include "cpprun/object_collectives.h"
#include "dist_test_support.h"

using dist_test::group;

namespace {

struct Stats {  // trivially copyable: sent as its bytes
  int64_t seen;
  double loss;
};

struct Named {  // not trivially copyable: needs a codec
  std::string name;
  std::vector<std::string> tags;
};

}  // namespace

template <>
struct cpprun::ObjectCodec<Named> {
  static std::string encode(const Named& n) {
    std::string out = n.name;
    for (const auto& t : n.tags) out += "\n" + t;
    return out;
  }
  static Named decode(const std::string& bytes) {
    Named n;
    std::size_t start = 0, end = bytes.find('\n');
    n.name = bytes.substr(0, end);
    while (end != std::string::npos) {
      start = end + 1;
      end = bytes.find('\n', start);
      n.tags.push_back(bytes.substr(start, end == std::string::npos ? std::string::npos : end - start));
    }
    return n;
  }
};

TEST_CASE("object collectives: broadcast strings, vectors, structs and a user codec from every root", "[objects]") {
  const int world = group().size(), rank = group().rank();
  for (int root = 0; root < world; ++root) {
    std::string text = rank == root ? std::string(1000 + root, 'a' + root) : "not yet";
    cpprun::broadcast_object(group(), text, root);
    CHECK(text == std::string(1000 + root, 'a' + root));

    std::vector<int64_t> numbers = rank == root ? std::vector<int64_t>{root, 7, -3} : std::vector<int64_t>{};
    cpprun::broadcast_object(group(), numbers, root);
    CHECK(numbers == std::vector<int64_t>{root, 7, -3});

    Stats stats{rank == root ? 42 : 0, rank == root ? 0.5 : 0.0};
    cpprun::broadcast_object(group(), stats, root);
    CHECK(stats.seen == 42);
    CHECK(stats.loss == 0.5);

    Named named = rank == root ? Named{"run", {"a", "", "bc"}} : Named{};
    cpprun::broadcast_object(group(), named, root);
    CHECK(named.name == "run");
    CHECK(named.tags == std::vector<std::string>{"a", "", "bc"});
  }
  std::string empty = rank == 0 ? "" : "something";
  cpprun::broadcast_object(group(), empty);
  CHECK(empty.empty());
}

TEST_CASE("object collectives: all_gather_object of different sizes, in rank order", "[objects]") {
  const int world = group().size(), rank = group().rank();
  auto texts = cpprun::all_gather_object(group(), std::string(3 * rank, 'x') + std::to_string(rank));
  REQUIRE(static_cast<int>(texts.size()) == world);
  for (int r = 0; r < world; ++r) CHECK(texts[r] == std::string(3 * r, 'x') + std::to_string(r));

  auto vectors = cpprun::all_gather_object(group(), std::vector<float>(rank, 1.5f * rank));
  for (int r = 0; r < world; ++r) CHECK(vectors[r] == std::vector<float>(r, 1.5f * r));

  auto stats = cpprun::all_gather_object(group(), Stats{rank, rank * 0.25});
  for (int r = 0; r < world; ++r) CHECK((stats[r].seen == r && stats[r].loss == r * 0.25));
}

TEST_CASE("object collectives: torch::serialize archives travel as bytes", "[objects]") {
  const int rank = group().rank();
  std::string bytes;
  if (rank == 0) {
    torch::serialize::OutputArchive out;
    out.write("weights", torch::arange(6, torch::kFloat).view({2, 3}));
    out.write("step", torch::tensor(17));
    bytes = cpprun::archive_bytes(out);
  }
  cpprun::broadcast_object(group(), bytes);
  torch::serialize::InputArchive in;
  cpprun::load_archive(in, bytes);
  torch::Tensor weights, step;
  in.read("weights", weights);
  in.read("step", step);
  CHECK(weights.equal(torch::arange(6, torch::kFloat).view({2, 3})));
  CHECK(step.item<int64_t>() == 17);
}

TEST_CASE("object collectives: bytes that cannot be the type are a clear error", "[objects]") {
  const int rank = group().rank();
  std::string three = "abc";
  cpprun::broadcast_object(group(), three);
  CHECK_THROWS_WITH(cpprun::ObjectCodec<Stats>::decode(three), Catch::Contains("3 bytes") && Catch::Contains("same C++ type"));
  CHECK_THROWS_WITH(cpprun::ObjectCodec<std::vector<int32_t>>::decode(three), Catch::Contains("3 bytes"));
  (void)rank;
}
