// Unit tests of the agents' messages: every kind survives a round trip, odd text included, and
// lines that are not messages are rejected.
#include <catch2/catch.hpp>

#include "rendezvous/node_messages.h"

using namespace cpprun::launcher;

namespace {

NodeMessage round_trip(const NodeMessage& m) {
  const std::string line = encode_message(m);
  INFO(line);
  CHECK(line.find('\n') == std::string::npos);
  const std::optional<NodeMessage> back = decode_message(line);
  REQUIRE(back);
  CHECK(back->kind == m.kind);
  return *back;
}

}  // namespace

TEST_CASE("node_messages: hello carries the node's settings, any run id and role", "[node_messages]") {
  NodeHello hello;
  hello.backend = "c10d";
  hello.node_rank = -1;
  hello.min_nodes = 2;
  hello.max_nodes = 4;
  hello.max_restarts = 2;
  hello.run_id = "job 7%\nx";
  hello.shape = {5, ""};
  const NodeMessage back = round_trip(NodeMessage::make_hello(hello));
  CHECK(back.hello.protocol == kNodeProtocolVersion);
  CHECK(back.hello.backend == "c10d");
  CHECK(back.hello.node_rank == -1);
  CHECK(back.hello.min_nodes == 2);
  CHECK(back.hello.max_nodes == 4);
  CHECK(back.hello.max_restarts == 2);
  CHECK(back.hello.run_id == "job 7%?x");  // escaped on the wire; a peer's control characters are never printed
  CHECK(back.hello.shape.local_world_size == 5);
  CHECK(back.hello.shape.role.empty());
}

TEST_CASE("node_messages: the other kinds", "[node_messages]") {
  CHECK(round_trip(NodeMessage::make_gathering(0, 2, {1, 3})).missing == std::vector<int>{1, 3});
  CHECK(round_trip(NodeMessage::make_gathering(0, 2, {})).missing.empty());

  const NodeMessage gathering = round_trip(NodeMessage::make_gathering(3, 2, {}));
  CHECK(gathering.round == 3);
  CHECK(gathering.nodes == 2);
  const NodeMessage queued = round_trip(NodeMessage::make_queued(1, 3, true));
  CHECK(queued.round == 1);
  CHECK(queued.nodes == 3);
  CHECK(queued.restarting);
  CHECK_FALSE(round_trip(NodeMessage::make_queued(1, 3, false)).restarting);

  RankLayout layout;
  layout.group_rank = 1;
  layout.group_world_size = 2;
  layout.base_rank = 2;
  layout.world_size = 3;
  layout.role_base_rank = 1;
  layout.role_world_size = 2;
  layout.master_port = 41000;
  const NodeMessage start = round_trip(NodeMessage::make_start(4, 1, layout));
  CHECK(start.round == 4);
  CHECK(start.restart_count == 1);
  CHECK(start.layout.group_rank == 1);
  CHECK(start.layout.group_world_size == 2);
  CHECK(start.layout.base_rank == 2);
  CHECK(start.layout.world_size == 3);
  CHECK(start.layout.role_base_rank == 1);
  CHECK(start.layout.role_world_size == 2);
  CHECK(start.layout.master_port == 41000);
  CHECK(start.layout.master_addr.empty());  // none chosen: the workers use the endpoint's host
  layout.master_addr = "10.0.0.7";          // the host's --local_addr
  CHECK(round_trip(NodeMessage::make_start(4, 1, layout)).layout.master_addr == "10.0.0.7");

  CHECK(round_trip(NodeMessage::make_done(2)).round == 2);
  CHECK(round_trip(NodeMessage::make_stopped(5)).round == 5);

  const JobEnd end{137, true, "rank 2 (local_rank 0, pid 41) on node 1 killed by SIGKILL (Killed)"};
  for (const NodeMessage& m : {NodeMessage::make_failed(1, end), NodeMessage::make_end(1, end)}) {
    const NodeMessage back = round_trip(m);
    CHECK(back.round == 1);
    CHECK(back.end.exit_code == 137);
    CHECK(back.end.restartable);
    CHECK(back.end.reason == end.reason);
  }
  const NodeMessage exit = round_trip(NodeMessage::make_exit({0, false, ""}));
  CHECK(exit.end.exit_code == 0);
  CHECK_FALSE(exit.end.restartable);
  CHECK(exit.end.reason.empty());
}

TEST_CASE("node_messages: lines that are not messages are rejected", "[node_messages]") {
  for (const char* line : {"", "hi", "GET / HTTP/1.1", "done", "done x", "done 1 2", "start 1 2 3", "gathering 1 2 1,x",
                           "gathering 1 2", "queued 1 2", "exit 1 0 %4", "exit 1 0 %zz", "end 1 1 1"}) {
    INFO(line);
    CHECK_FALSE(decode_message(line));
  }
}

TEST_CASE("node_messages: a hello of another protocol version still says its version", "[node_messages]") {
  const std::optional<NodeMessage> m = decode_message("hello 99");
  REQUIRE(m);
  CHECK(m->hello.protocol == 99);
  CHECK(join_ranks({1, 3, 4}) == "1, 3, 4");
}
