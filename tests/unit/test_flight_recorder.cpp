// The flight recorder's parts that need no processes: the ring buffer (order, overwriting,
// finishing), the JSON it is written as, the CPPRUN_FLIGHT_RECORDER_ENTRIES rule, the public
// dump; and, hidden ([.bench]), the cost of recording one collective.
#include "catch.h"
#include <ATen/ATen.h>  // at::empty
#include <c10/util/Exception.h>

#include <chrono>
#include <iostream>
#include <thread>

#include "comm/flight_recorder.h"
#include "comm/flight_recorder_json.h"
#include "comm/flight_recorder_ring.h"
#include "cpprun/flight_recorder.h"
#include "scratch_files.h"

using cpprun::CollectiveState;
using cpprun::FlightRecorderEntry;
using cpprun::ReduceOp;
using cpprun::detail::DumpHeader;
using cpprun::detail::DumpReason;
using cpprun::detail::FlightRecorderRing;
using cpprun::detail::RecordedCall;
using cpprun::detail::RecordedGroup;

namespace {

RecordedCall call_numbered(uint64_t seq, const std::shared_ptr<const RecordedGroup>& group = nullptr) {
  RecordedCall call;
  call.group = group;
  call.seq = seq;
  call.op = "all_reduce";
  call.dtype = at::kFloat;
  call.tensor_count = 1;
  call.shapes[0] = {4096};
  call.reduce = ReduceOp::kSum;
  call.start_unix_ms = 1000 + static_cast<int64_t>(seq);
  return call;
}

std::vector<uint64_t> seqs(const std::vector<FlightRecorderEntry>& entries) {
  std::vector<uint64_t> out;
  for (const auto& e : entries) out.push_back(e.seq);
  return out;
}

}  // namespace

TEST_CASE("flight recorder: the ring keeps the last entries, oldest first", "[flight_recorder]") {
  FlightRecorderRing ring(3);
  CHECK(ring.entries().empty());
  std::vector<uint64_t> ids;
  for (uint64_t seq = 1; seq <= 2; ++seq) ids.push_back(ring.start(call_numbered(seq)));
  CHECK(seqs(ring.entries()) == std::vector<uint64_t>{1, 2});
  for (uint64_t seq = 3; seq <= 5; ++seq) ids.push_back(ring.start(call_numbered(seq)));
  CHECK(seqs(ring.entries()) == std::vector<uint64_t>{3, 4, 5});
  for (uint64_t id : ids) CHECK(id != 0);
}

TEST_CASE("flight recorder: finishing marks the entry once, never an overwritten one", "[flight_recorder]") {
  FlightRecorderRing ring(2);
  const uint64_t first = ring.start(call_numbered(1));
  const uint64_t second = ring.start(call_numbered(2));
  int64_t start = 0;
  CHECK(ring.finish(second, CollectiveState::kFailed, 5000, &start));
  CHECK(start == 1002);
  CHECK_FALSE(ring.finish(second, CollectiveState::kCompleted, 6000));  // already failed
  const uint64_t third = ring.start(call_numbered(3));                    // overwrites the first
  CHECK_FALSE(ring.finish(first, CollectiveState::kCompleted, 7000));
  CHECK_FALSE(ring.finish(0, CollectiveState::kCompleted, 7000));
  const auto entries = ring.entries();
  REQUIRE(entries.size() == 2);
  CHECK(entries[0].seq == 2);
  CHECK(entries[0].state == CollectiveState::kFailed);
  CHECK(entries[0].end_unix_ms == std::optional<int64_t>(5000));
  CHECK(entries[1].seq == 3);
  CHECK(entries[1].state == CollectiveState::kStarted);
  CHECK_FALSE(entries[1].end_unix_ms.has_value());
  CHECK(ring.finish(third, CollectiveState::kCompleted, 8000));
  CHECK(ring.entries()[1].state == CollectiveState::kCompleted);
}

TEST_CASE("flight recorder: an entry carries the call as recorded", "[flight_recorder]") {
  auto group = std::make_shared<RecordedGroup>(RecordedGroup{"0/sub1", {1, 3}});
  FlightRecorderRing ring(4);
  RecordedCall call;
  call.group = group;
  call.seq = 7;
  call.op = "reduce_scatter";
  call.dtype = at::kBFloat16;
  call.tensor_count = 2;
  call.shapes[0] = {2, 3};
  call.shapes[1] = {4, 3, 1, 1, 1, 1, 1, 5};  // more dims than stay inline
  call.reduce = ReduceOp::kMax;
  call.root = 1;
  call.tag = 9;
  call.label = "what it carries";
  call.public_call = "cpprun::save_state_dict";
  call.start_unix_ms = 42;
  ring.start(std::move(call));
  const FlightRecorderEntry e = ring.entries().at(0);
  CHECK(e.group == "0/sub1");
  CHECK(e.group_ranks == std::vector<int>{1, 3});
  CHECK(e.seq == 7);
  CHECK(e.op == "reduce_scatter");
  CHECK(e.dtype == std::optional<std::string>("bfloat16"));
  CHECK(e.shapes == std::vector<std::vector<int64_t>>{{2, 3}, {4, 3, 1, 1, 1, 1, 1, 5}});
  CHECK(e.reduce_op == std::optional<std::string>("max"));
  CHECK(e.root == std::optional<int>(1));
  CHECK(e.tag == std::optional<int>(9));
  CHECK(e.label == std::optional<std::string>("what it carries"));
  CHECK(e.public_call == std::optional<std::string>("cpprun::save_state_dict"));
  CHECK(e.start_unix_ms == 42);
}

TEST_CASE("flight recorder: capacity 0 records nothing", "[flight_recorder]") {
  FlightRecorderRing ring(0);
  CHECK_FALSE(ring.enabled());
  CHECK(ring.start(call_numbered(1)) == 0);
  CHECK(ring.entries().empty());
}

TEST_CASE("flight recorder: subgroups are named under their parent, with global ranks", "[flight_recorder]") {
  auto world = cpprun::detail::recorded_world_group(0, 4);
  CHECK(world->name == "0");
  CHECK(world->ranks == std::vector<int>{0, 1, 2, 3});
  auto sub = cpprun::detail::recorded_subgroup(*world, "sub0", {1, 3});
  auto subsub = cpprun::detail::recorded_subgroup(*sub, "sub0/1", {1});
  CHECK(sub->name == "0/sub0");
  CHECK(subsub->name == "0/sub0/sub0/1");
  CHECK(subsub->ranks == std::vector<int>{3});
}

TEST_CASE("flight recorder: CPPRUN_FLIGHT_RECORDER_ENTRIES", "[flight_recorder]") {
  using cpprun::detail::parse_flight_recorder_entries;
  CHECK(parse_flight_recorder_entries(std::nullopt) == 2000);
  CHECK(parse_flight_recorder_entries("0") == 0);
  CHECK(parse_flight_recorder_entries("16") == 16);
  for (const char* bad : {"", "abc", "-1", "12x", "2000000", " 5"}) {
    INFO(bad);
    CHECK_THROWS_WITH(parse_flight_recorder_entries(std::string(bad)),
                      Catch::Contains(std::string("CPPRUN_FLIGHT_RECORDER_ENTRIES=\"") + bad + "\" is not a number") &&
                          Catch::Contains("0 turns it off"));
  }
}

TEST_CASE("flight recorder: the JSON format", "[flight_recorder]") {
  DumpHeader header;
  header.rank = 1;
  header.world_size = 2;
  header.pid = 4242;
  header.dumped_unix_ms = 1700000000123;
  header.reason = DumpReason::kTimeout;

  FlightRecorderEntry done;
  done.group = "0";
  done.group_ranks = {0, 1};
  done.seq = 2;
  done.op = "all_reduce";
  done.dtype = "float32";
  done.shapes = {{4096}};
  done.reduce_op = "sum";
  done.state = CollectiveState::kCompleted;
  done.start_unix_ms = 1700000000000;
  done.end_unix_ms = 1700000000005;
  done.public_call = "DistributedDataParallel's backward";

  FlightRecorderEntry waiting;
  waiting.group = "0/\"odd\"\\name\n";  // escaped as JSON requires
  waiting.group_ranks = {1};
  waiting.seq = 3;
  waiting.op = "recv";
  waiting.root = 0;
  waiting.tag = 5;
  waiting.label = "pipeline stage 1: the activation of micro-batch 0 from stage 0";
  waiting.start_unix_ms = 1700000000010;

  CHECK(cpprun::detail::flight_recorder_json(header, {done, waiting}) ==
        "{\"format\":\"cpprun-flight-recorder\",\"version\":1,\"rank\":1,\"world_size\":2,\"pid\":4242,"
        "\"dumped_unix_ms\":1700000000123,\"reason\":\"timeout\",\"entries\":[\n"
        "{\"group\":\"0\",\"group_ranks\":[0,1],\"seq\":2,\"op\":\"all_reduce\",\"dtype\":\"float32\","
        "\"shapes\":[[4096]],\"reduce_op\":\"sum\",\"root\":null,\"tag\":null,\"label\":null,"
        "\"public_call\":\"DistributedDataParallel's backward\",\"state\":\"completed\","
        "\"start_unix_ms\":1700000000000,\"end_unix_ms\":1700000000005},\n"
        "{\"group\":\"0/\\\"odd\\\"\\\\name\\n\",\"group_ranks\":[1],\"seq\":3,\"op\":\"recv\",\"dtype\":null,"
        "\"shapes\":[],\"reduce_op\":null,\"root\":0,\"tag\":5,"
        "\"label\":\"pipeline stage 1: the activation of micro-batch 0 from stage 0\",\"public_call\":null,"
        "\"state\":\"started\","
        "\"start_unix_ms\":1700000000010,\"end_unix_ms\":null}\n"
        "]}\n");
  header.reason = DumpReason::kRequest;
  CHECK(cpprun::detail::flight_recorder_json(header, {}) ==
        "{\"format\":\"cpprun-flight-recorder\",\"version\":1,\"rank\":1,\"world_size\":2,\"pid\":4242,"
        "\"dumped_unix_ms\":1700000000123,\"reason\":\"request\",\"entries\":[]}\n");
}

TEST_CASE("flight recorder: dump_flight_recorder writes the process's recorder", "[flight_recorder]") {
  scratch::ScratchDir dir("flight_recorder");
  const auto path = dir.path / "rank_0.json";
  cpprun::dump_flight_recorder(path.string());
  const std::string json = scratch::contents(path);
  CHECK_THAT(json, Catch::StartsWith("{\"format\":\"cpprun-flight-recorder\",\"version\":1,\"rank\":"));
  CHECK_THAT(json, Catch::Contains("\"reason\":\"request\""));
  CHECK_FALSE(std::filesystem::exists(path.string() + ".tmp"));
  CHECK_THROWS_WITH(cpprun::dump_flight_recorder((dir.path / "missing" / "rank_0.json").string()),
                    Catch::Contains("missing/rank_0.json"));
}

// The cost of recording one collective (start + finish), alone and with a second thread
// recording beside it. Run: cpprun_unit_tests "[.bench]"
TEST_CASE("flight recorder: cost per collective", "[.bench]") {
  auto group = cpprun::detail::recorded_world_group(0, 8);
  const at::Tensor tensor = at::empty({4096});
  const std::vector<at::Tensor> tensors{tensor};
  auto measure = [&](int threads) {
    constexpr int kCalls = 1'000'000;
    const auto begin = std::chrono::steady_clock::now();
    std::vector<std::thread> workers;
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back([&] {
        for (int i = 0; i < kCalls; ++i) {
          const uint64_t id = cpprun::detail::record_issued(group, i, "all_reduce", tensors, ReduceOp::kSum, std::nullopt);
          cpprun::detail::record_completed(id);
        }
      });
    }
    for (auto& w : workers) w.join();
    const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - begin).count();
    return ns / kCalls;  // per call per thread: what each collective waits
  };
  std::cout << "flight recorder (" << cpprun::detail::flight_recorder().capacity()
            << " entries): record + finish one collective: " << measure(1) << " ns on one thread, "
            << measure(2) << " ns per call with two threads recording at once\n";
}
