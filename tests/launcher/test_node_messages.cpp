// Unit tests of the agents' messages: every kind survives a round trip, odd text included, and
// lines that are not messages are rejected.
#include "catch.h"

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
  CHECK_FALSE(start.layout.store_tunnelled);  // --no_job_secret: the store is reached directly
  layout.store_tunnelled = true;             // a job secret: through the link (store_tunnel_io.h)
  CHECK(round_trip(NodeMessage::make_start(4, 1, layout)).layout.store_tunnelled);

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

namespace {

CollectiveRecord record(int64_t seq, CollectiveRecord::State state) {
  CollectiveRecord c;
  c.group = "world";
  c.seq = seq;
  c.op = "all_reduce";
  c.dtype = "float32";
  c.shapes = "[4096], [2, 3]";
  c.reduce_op = "sum";
  c.state = state;
  c.start_unix_ms = 1764180000000 + seq;
  if (state != CollectiveRecord::State::kStarted) c.end_unix_ms = c.start_unix_ms + 5;
  return c;
}

RankEvidence dumped_rank(int rank, std::size_t entries) {
  RankEvidence e;
  e.rank = rank;
  e.fate = "exited with code 3";
  FlightDump& d = e.dump.emplace();
  d.rank = rank;
  d.world_size = 4;
  d.pid = 4242;
  d.dumped_unix_ms = 1764180009000;
  d.reason = "failure";
  for (std::size_t i = 1; i <= entries; ++i) d.entries.push_back(record(static_cast<int64_t>(i), CollectiveRecord::State::kCompleted));
  return e;
}

}  // namespace

TEST_CASE("node_messages: evidence carries a rank's fate and its whole dump", "[node_messages]") {
  RankEvidence e = dumped_rank(2, 3);
  e.dump->entries[1].group = "tp 0";  // a subgroup, with its members and a root
  e.dump->entries[1].group_ranks = {0, 2};
  e.dump->entries[1].root = 2;
  e.dump->entries[1].reduce_op = "";
  e.dump->entries.back().state = CollectiveRecord::State::kFailed;
  e.dump->entries.push_back(record(9, CollectiveRecord::State::kStarted));
  CollectiveRecord& message = e.dump->entries.back();  // a pipeline's receive: its peer, tag and label
  message.op = "recv";
  message.reduce_op = "";
  message.root = 1;
  message.tag = 67108866;
  message.label = "pipeline stage 1: the activation of micro-batch 0 from stage 0";
  const NodeMessage back = round_trip(NodeMessage::make_evidence(3, e));
  CHECK(back.round == 3);
  CHECK(back.request == 0);  // a failure's
  CHECK(back.evidence.rank == 2);
  CHECK(back.evidence.fate == "exited with code 3");
  REQUIRE(back.evidence.dump);
  const FlightDump& d = *back.evidence.dump;
  CHECK(d.rank == 2);
  CHECK(d.world_size == 4);
  CHECK(d.pid == 4242);
  CHECK(d.dumped_unix_ms == 1764180009000);
  CHECK(d.reason == "failure");
  REQUIRE(d.entries.size() == 4);
  for (std::size_t i = 0; i < d.entries.size(); ++i) {
    INFO(i);
    CHECK(d.entries[i].describe() == e.dump->entries[i].describe());
    CHECK(d.entries[i].group == e.dump->entries[i].group);
    CHECK(d.entries[i].group_ranks == e.dump->entries[i].group_ranks);
    CHECK(d.entries[i].state == e.dump->entries[i].state);
    CHECK(d.entries[i].start_unix_ms == e.dump->entries[i].start_unix_ms);
    CHECK(d.entries[i].end_unix_ms == e.dump->entries[i].end_unix_ms);
  }
  CHECK(d.entries[1].root == 2);
  CHECK_FALSE(d.entries[1].tag);
  CHECK(d.entries[1].label.empty());
  CHECK_FALSE(d.entries[3].end_unix_ms);
  CHECK(d.entries[3].root == 1);
  CHECK(d.entries[3].tag == 67108866);
  CHECK(d.entries[3].label == "pipeline stage 1: the activation of micro-batch 0 from stage 0");
  // A peer's label is cut as a dump's is: one line's worth.
  e.dump->entries.back().label = std::string(5000, 'x');
  CHECK(round_trip(NodeMessage::make_evidence(3, e)).evidence.dump->entries.back().label.size() == kMaxLabelBytes);

  RankEvidence none;
  none.rank = 5;
  none.no_dump_reason = "asked for a dump, none came within 2 s";
  const NodeMessage without = round_trip(NodeMessage::make_evidence(0, none));
  CHECK(without.evidence.rank == 5);
  CHECK(without.evidence.fate == kStillRunning);
  CHECK(without.evidence.no_dump_reason == none.no_dump_reason);
  CHECK_FALSE(without.evidence.dump);
}

TEST_CASE("node_messages: evidence is bounded: the oldest entries that do not fit are dropped",
          "[node_messages]") {
  // As many entries as a CPPRUN_FLIGHT_RECORDER_ENTRIES=5000 recorder holds: the newest 2000 travel.
  const NodeMessage many = NodeMessage::make_evidence(0, dumped_rank(1, 5000));
  REQUIRE(many.evidence.dump);
  CHECK(many.evidence.dump->entries.size() == kMaxEvidenceEntries);
  CHECK(many.evidence.dump->entries.front().seq == 3001);
  CHECK(many.evidence.dump->entries.back().seq == 5000);
  CHECK(encode_message(many).size() <= kMaxEvidenceBytes);
  CHECK(round_trip(many).evidence.dump->entries.size() == kMaxEvidenceEntries);

  // Entries far larger than usual (long group names): fewer fit, the newest kept, the line within the cap.
  RankEvidence wide = dumped_rank(1, 2000);
  for (CollectiveRecord& c : wide.dump->entries) c.group = std::string(1000, 'g');
  const NodeMessage fitted = NodeMessage::make_evidence(0, wide);
  CHECK(encode_message(fitted).size() <= kMaxEvidenceBytes);
  CHECK(fitted.evidence.dump->entries.size() < 2000);
  CHECK(fitted.evidence.dump->entries.size() > 400);
  CHECK(fitted.evidence.dump->entries.back().seq == 2000);

  // A fate or reason longer than a rank's words may be is cut.
  RankEvidence talky;
  talky.rank = 0;
  talky.fate = std::string(100000, 'x');
  CHECK(encode_message(NodeMessage::make_evidence(0, talky)).size() < 4096);
}

TEST_CASE("node_messages: hostile evidence is refused, never a crash", "[node_messages]") {
  const std::string good = encode_message(NodeMessage::make_evidence(1, dumped_rank(2, 1)));
  REQUIRE(decode_message(good));
  // evidence ROUND REQUEST RANK FATE REASON HAS_DUMP [RANK WORLD PID DUMPED REASON COUNT [GROUP RANKS SEQ OP DTYPE
  // SHAPES REDUCE ROOT TAG LABEL STATE START END]...]
  const std::string head = "evidence 1 0 2 exited%20with%20code%203 % 1 2 4 4242 1764180009000 failure";
  const std::string entry = " world - 1 all_reduce float32 [4096] sum - - % completed 100 105";
  CHECK(decode_message(head + " 1" + entry));
  for (const std::string& line : {
           std::string("evidence"), std::string("evidence 1"), std::string("evidence 1 0 2 x % 0 extra"),
           std::string("evidence 1 0 -2 x % 0"),                     // a negative rank
           std::string("evidence 1 -1 2 x % 0"),                     // a negative request
           std::string("evidence 1 x 2 x % 0"),                      // a request that is not a number
           std::string("evidence 1 2 x % 0"),                        // protocol 6's words: no request
           std::string("evidence 1 0 2 x % 1"),                      // a dump announced, none follows
           head + " 2" + entry,                                      // fewer entries than announced
           head + " 1" + entry + entry,                              // more
           head + " -1",                                             // a negative count
           head + " 2001" + entry,                                   // more entries than the cap
           head + " 99999999999" + entry,                            // a count out of range
           head + " 1 world - 1 all_reduce float32 [4096] sum - - % exploded 100 105",   // an unknown state
           head + " 1 world 1,x 1 all_reduce float32 [4096] sum - - % completed 100 105",  // a bad rank list
           head + " 1 world - 1.5 all_reduce float32 [4096] sum - - % completed 100 105",  // a bad seq
           head + " 1 world - 1 all_reduce float32 [4096] sum - - % completed 100 99999999999999999999",  // overflow
           head + " 1 world - 1 all_reduce float32 [4096] sum - - %zz completed 100 105",  // bad escaping
       }) {
    INFO(line.substr(0, 200));
    CHECK_FALSE(decode_message(line));
  }
  // A line longer than any evidence message may be is refused before it is read.
  std::string oversize = head + " 1" + entry;
  oversize.insert(oversize.find(" world") + 1, std::string(kMaxEvidenceBytes, 'w'));
  CHECK_FALSE(decode_message(oversize));
  // A peer's control characters are never printed.
  const std::optional<NodeMessage> odd = decode_message("evidence 1 0 2 bad%1B[31m % 0");
  REQUIRE(odd);
  CHECK(odd->evidence.fate == "bad?[31m");
}

TEST_CASE("node_messages: ask and its answers carry the request's number", "[node_messages]") {
  const NodeMessage ask = round_trip(NodeMessage::make_ask(2, 7));
  CHECK(ask.round == 2);
  CHECK(ask.request == 7);
  CHECK(encode_message(ask) == "ask 2 7");
  const NodeMessage answer = round_trip(NodeMessage::make_evidence(2, dumped_rank(3, 2), 7));
  CHECK(answer.round == 2);
  CHECK(answer.request == 7);
  CHECK(answer.evidence.rank == 3);
  REQUIRE(answer.evidence.dump);
  CHECK(answer.evidence.dump->entries.size() == 2);
  // An answer is bounded as a failure's evidence is.
  const NodeMessage many = NodeMessage::make_evidence(2, dumped_rank(1, 5000), 7);
  CHECK(many.evidence.dump->entries.size() == kMaxEvidenceEntries);
  CHECK(encode_message(many).size() <= kMaxEvidenceBytes);
  CHECK(round_trip(many).request == 7);
}

TEST_CASE("node_messages: hostile asks are refused, never a crash", "[node_messages]") {
  for (const char* line : {"ask", "ask 1", "ask 1 0", "ask 1 -3", "ask 1 x", "ask x 1", "ask 1 2 3", "ask 1 %zz",
                           "ask 1 99999999999", "ask 1 2%00"}) {
    INFO(line);
    CHECK_FALSE(decode_message(line));
  }
}

TEST_CASE("node_messages: the store tunnel's open, data, credit and close", "[node_messages]") {
  const NodeMessage open = round_trip(NodeMessage::make_open(3, 7));
  CHECK(encode_message(open) == "open 3 7");
  CHECK(open.round == 3);
  CHECK(open.channel == 7);
  const NodeMessage credit = round_trip(NodeMessage::make_credit(7, 65536));
  CHECK(encode_message(credit) == "credit 7 65536");
  CHECK(credit.channel == 7);
  CHECK(credit.credit == 65536);
  const NodeMessage close = round_trip(NodeMessage::make_close(7));
  CHECK(encode_message(close) == "close 7");
  CHECK(close.channel == 7);
  // These four go to the tunnel; every other kind to the rendezvous.
  for (const MessageKind kind : {MessageKind::kOpen, MessageKind::kData, MessageKind::kCredit, MessageKind::kClose}) {
    CHECK(is_tunnel_kind(kind));
  }
  for (const MessageKind kind : {MessageKind::kHello, MessageKind::kGathering, MessageKind::kQueued,
                                 MessageKind::kStart, MessageKind::kDone, MessageKind::kFailed, MessageKind::kStopped,
                                 MessageKind::kEnd, MessageKind::kExit, MessageKind::kEvidence, MessageKind::kAsk}) {
    CHECK_FALSE(is_tunnel_kind(kind));
  }

  // Any bytes, as base64 (RFC 4648's spelling, so other tools read it too); each length's padding.
  CHECK(encode_message(NodeMessage::make_data(2, "Man")) == "data 2 TWFu");
  CHECK(encode_message(NodeMessage::make_data(2, "Ma")) == "data 2 TWE=");
  CHECK(encode_message(NodeMessage::make_data(2, "M")) == "data 2 TQ==");
  std::string every_byte;
  for (int c = 0; c < 256; ++c) every_byte += static_cast<char>(c);
  for (std::size_t n = 1; n <= 4; ++n) {
    const std::string bytes = every_byte.substr(0, n) + every_byte;
    const NodeMessage data = round_trip(NodeMessage::make_data(9, bytes));
    CHECK(data.channel == 9);
    CHECK(data.bytes == bytes);  // raw: not made printable as a text word is
  }
}

TEST_CASE("node_messages: a 48 KiB chunk fits in a data message, one byte more is refused", "[node_messages]") {
  std::string chunk(kMaxTunnelChunkBytes, '\0');
  for (std::size_t i = 0; i < chunk.size(); ++i) chunk[i] = static_cast<char>(i * 131);
  const std::string line = encode_message(NodeMessage::make_data(12, chunk));
  CHECK(line.size() == std::string("data 12 ").size() + 64 * 1024);
  CHECK(round_trip(NodeMessage::make_data(12, chunk)).bytes == chunk);

  std::string why;
  CHECK_FALSE(decode_message(encode_message(NodeMessage::make_data(12, chunk + "x")), &why));
  CHECK(why == "sent data for channel 12 of 49153 bytes, more than the 49152 one message may carry");
}

TEST_CASE("node_messages: hostile tunnel messages are refused with what is wrong, never a crash",
          "[node_messages]") {
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"data 1 TWF", "sent data for channel 1 that is not base64"},   // not a multiple of 4
      {"data 1 TW=u", "sent data for channel 1 that is not base64"},  // '=' inside
      {"data 1 T===", "sent data for channel 1 that is not base64"},  // too much padding
      {"data 1 TR==", "sent data for channel 1 that is not base64"},  // bits beyond the last byte: not canonical
      {"data 1 TWF%", "sent data for channel 1 that is not base64"},
      {"data 1 TWF-", "sent data for channel 1 that is not base64"},  // base64url is not ours
      {"data 1 %", "sent data for channel 1 that is not base64"},
      {"data 1 ====", "sent data for channel 1 that is not base64"},
      {"data 0 TWFu", "sent `data` for channel 0; channels are numbered from 1"},
      {"close -2", "sent `close` for channel -2; channels are numbered from 1"},
      {"open 1 0", "sent `open` for channel 0; channels are numbered from 1"},
      {"credit 1 0", "sent `credit` of 0 bytes for channel 1; credit is at least 1 byte"},
      {"credit 1 -5", "sent `credit` of -5 bytes for channel 1; credit is at least 1 byte"},
  };
  for (const auto& [line, reason] : refused) {
    INFO(line);
    std::string why;
    CHECK_FALSE(decode_message(line, &why));
    CHECK(why == reason);
  }
  for (const char* line : {"data", "data 1", "data x TWFu", "data 1 TWFu TWFu", "open", "open 1", "open -1 1",
                           "open 1 1 1", "open 1 x", "credit 1", "credit 1 99999999999", "credit 1 1 1", "close",
                           "close 1 1", "close %zz", "close 1.5"}) {
    INFO(line);
    std::string why;
    CHECK_FALSE(decode_message(line, &why));
    CHECK(why == "sent a line that is not a cpprun agent message");
  }
  CHECK(decode_message("data 1 AA=="));  // one zero byte
}

TEST_CASE("node_messages: protocol 9 has evidence's tags and labels; an agent of 8 says so at hello",
          "[node_messages]") {
  CHECK(kNodeProtocolVersion == 9);
  const std::optional<NodeMessage> old = decode_message("hello 8 static 1 2 2 1 0 job %");
  REQUIRE(old);
  CHECK(old->hello.protocol == 8);  // admission refuses it, naming both versions (test_admission.cpp)
}
