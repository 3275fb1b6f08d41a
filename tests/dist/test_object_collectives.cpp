// broadcast_object / all_gather_object for strings, vectors, plain structs, torch::serialize
// archives and a user's own codec, under `cpprun --nproc_per_node=K` for K = 1..4.
#include "catch.h"
#include <torch/torch.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
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

// torch.distributed.gather_object and scatter_object_list: to and from every root, values of
// different sizes (rank 0's empty), each rank's own.
TEST_CASE("object collectives: gather_object and scatter_object, to and from every root", "[objects]") {
  const int world = group().size(), rank = group().rank();
  const auto text_of = [](int r) { return std::string(5 * r, 'a' + static_cast<char>(r)); };
  for (int root = 0; root < world; ++root) {
    INFO("root " << root);
    const auto texts = cpprun::gather_object(group(), text_of(rank), root);
    if (rank == root) {
      REQUIRE(static_cast<int>(texts.size()) == world);
      for (int r = 0; r < world; ++r) CHECK(texts[r] == text_of(r));
    } else {
      CHECK(texts.empty());
    }
    std::vector<std::vector<int64_t>> values;
    if (rank == root) {
      for (int r = 0; r < world; ++r) values.push_back(std::vector<int64_t>(r, 10 * root + r));
    }
    CHECK(cpprun::scatter_object(group(), values, root) == std::vector<int64_t>(rank, 10 * root + rank));
    CHECK(cpprun::scatter_object(group(), rank == root ? std::vector<std::string>(world) : std::vector<std::string>{},
                                 root).empty());
  }
  // The root given another count than the group's size: every rank refuses alike.
  CHECK_THROWS_WITH(cpprun::scatter_object(group(), std::vector<int>(world + 1), 0),
                    Catch::Contains("rank 0 (the root) was given") && Catch::Contains("one value per rank"));
  CHECK(cpprun::gather_object(group(), Stats{rank, 0.5}, world - 1).size() ==
        static_cast<std::size_t>(rank == world - 1 ? world : 0));
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

// An address is not a value: a string_view broadcast as its bytes gave the other ranks rank 0's
// pointer (a crash or garbage there). Such types have no codec, so they do not compile.
static_assert(cpprun::detail::copied_as_bytes<Stats> && cpprun::detail::copied_as_bytes<int>);
static_assert(!cpprun::detail::copied_as_bytes<const char*> && !cpprun::detail::copied_as_bytes<std::string_view> &&
              !cpprun::detail::copied_as_bytes<int Stats::*> && !cpprun::detail::copied_as_bytes<std::nullptr_t> &&
              !cpprun::detail::copied_as_bytes<std::reference_wrapper<int>>);

TEST_CASE("object collectives: a subgroup's non-member and a mismatched call are clear errors", "[objects]") {
  const int world = group().size(), rank = group().rank();
  if (world == 1) return;
  // A rank outside the subgroup is refused by name, as every collective refuses it (it asked
  // at::empty for -1 bytes).
  cpprun::ProcessGroup first = cpprun::new_group(group(), {0});
  if (rank != 0) {
    CHECK_THROWS_WITH(cpprun::all_gather_object(first, 1), Catch::Contains("all_gather_object") &&
                                                               Catch::Contains("not a member of this subgroup"));
    int value = 0;
    CHECK_THROWS_WITH(cpprun::broadcast_object(first, value), Catch::Contains("broadcast_object") &&
                                                                  Catch::Contains("not a member of this subgroup"));
  }
  // Rank 0 broadcasts a tensor where the others broadcast an object: the size they receive is not
  // one, and they say so (negative, and more than any process holds).
  for (const int64_t announced : {int64_t{-1}, int64_t{1} << 62}) {
    if (rank == 0) {
      cpprun::broadcast(group(), at::tensor({announced, int64_t{0}}, at::kLong));  // size, no type
    } else {
      std::string received;
      CHECK_THROWS_WITH(cpprun::broadcast_object(group(), received),
                        Catch::Contains("broadcast_object: rank 0 of the group announced") &&
                            Catch::Contains("or another collective"));
    }
  }
}

// Note [An object's type on the wire]: rank 0's std::string "12345678" was rank 1's int64_t
// 4050765991979987505, without a word.
TEST_CASE("object collectives: ranks passing different C++ types are refused, naming this rank's", "[objects]") {
  const int world = group().size(), rank = group().rank();
  if (world == 1) return;
  if (rank == 0) {
    std::string text = "12345678";
    cpprun::broadcast_object(group(), text);
  } else {
    int64_t number = 0;
    CHECK_THROWS_WITH(cpprun::broadcast_object(group(), number),
                      Catch::Contains("broadcast_object: rank 0 of the group passed a value of another C++ type "
                                      "than this rank's long"));
  }
  // Every rank sees every rank's type here, and every rank refuses.
  const auto all_gathered = [&] {
    return rank == 0 ? cpprun::all_gather_object(group(), int64_t{7}).size()
                     : cpprun::all_gather_object(group(), 7.0).size();
  };
  CHECK_THROWS_WITH(all_gathered(), Catch::Contains("all_gather_object: rank ") && Catch::Contains("another C++ type"));
  const auto gathered = [&] {
    return rank == 0 ? cpprun::gather_object(group(), int64_t{7}).size() : cpprun::gather_object(group(), 7.0).size();
  };
  CHECK_THROWS_WITH(gathered(), Catch::Contains("gather_object: rank ") && Catch::Contains("another C++ type"));
  if (rank == 0) {
    CHECK(cpprun::scatter_object(group(), std::vector<int64_t>(static_cast<std::size_t>(world), 5)) == 5);
  } else {
    CHECK_THROWS_WITH(cpprun::scatter_object<double>(group(), {}),
                      Catch::Contains("scatter_object: rank 0 of the group passed a value of another C++ type "
                                      "than this rank's double"));
  }
  // Bytes carry no type: a byte-level broadcast and a std::string still meet.
  std::string text = rank == 0 ? "hello" : "";
  if (rank == 0) {
    cpprun::broadcast_bytes(group(), text);
  } else {
    cpprun::broadcast_object(group(), text);
  }
  CHECK(text == "hello");
}
