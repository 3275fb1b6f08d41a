// Unit tests of reading flight-recorder dumps and of the diagnosis made from them.
#include "catch.h"

#include <algorithm>
#include <string>
#include <vector>

#include "diagnosis/flight_dump.h"
#include "diagnosis/hang_diagnosis.h"
#include "support/json.h"

using namespace cpprun::launcher;
using Catch::Matchers::Contains;

namespace {

// One entry of a dump as the library writes it.
std::string entry(int seq, const std::string& op, const std::string& state, long long start_ms,
                  const std::string& extra = "\"dtype\":\"float32\",\"shapes\":[[4096]],\"reduce_op\":\"sum\"") {
  return "{\"group\":\"world\",\"group_ranks\":[],\"seq\":" + std::to_string(seq) + ",\"op\":\"" + op + "\"," +
         extra + ",\"root\":null,\"state\":\"" + state + "\",\"start_unix_ms\":" + std::to_string(start_ms) +
         ",\"end_unix_ms\":" + (state == "completed" ? std::to_string(start_ms + 5) : std::string("null")) + "}";
}

std::string dump_json(int rank, int world, long long dumped_ms, const std::vector<std::string>& entries) {
  std::string list;
  for (const std::string& e : entries) list += (list.empty() ? "" : ",") + e;
  return "{\"format\":\"cpprun-flight-recorder\",\"version\":1,\"rank\":" + std::to_string(rank) +
         ",\"world_size\":" + std::to_string(world) + ",\"pid\":42,\"dumped_unix_ms\":" + std::to_string(dumped_ms) +
         ",\"reason\":\"request\",\"entries\":[" + list + "]}";
}

RankEvidence evidence(int rank, const std::string& json, const std::string& fate = "still running") {
  RankEvidence r;
  r.rank = rank;
  r.dump = parse_flight_dump(json);
  r.fate = fate;
  return r;
}

std::string joined(const Diagnosis& d) {
  std::string all;
  for (const std::string& l : d.lines) all += l + "\n";
  return all;
}

}  // namespace

TEST_CASE("flight_dump: a hostile file is refused, bounded, never a crash", "[hang_diagnosis]") {
  // Nested a million deep: refused by the depth bound, not a stack overflow.
  CHECK_THROWS_WITH(parse_flight_dump(std::string(1000000, '[')), Contains("invalid JSON"));
  CHECK_THROWS_WITH(parse_flight_dump("{\"format\":\"cpprun-flight-recorder\",\"version\":1e999}"),
                    Contains("not an integer"));
  std::string huge_seq = dump_json(0, 1, 0, {entry(1, "all_reduce", "started", 0)});
  huge_seq.replace(huge_seq.find("\"seq\":1"), 7, "\"seq\":99999999999999999999999");
  CHECK_THROWS_WITH(parse_flight_dump(huge_seq), Contains("not an integer in range"));
  // A barrier has no dtype (null), as the library writes it.
  const FlightDump barrier = parse_flight_dump(dump_json(
      0, 1, 0, {entry(1, "barrier", "started", 0, "\"dtype\":null,\"shapes\":[],\"reduce_op\":null")}));
  CHECK(barrier.entries.at(0).describe() == "barrier #1 ()");
  // Every string the diagnosis prints comes cleaned of control characters and cut: a worker's file
  // cannot write escape sequences to the console (op, group, dtype and reduce op came as read).
  const std::string esc = "\\u001b[2J";
  std::string hostile = dump_json(
      0, 1, 0, {entry(1, "all_reduce" + esc, "started", 0,
                      "\"dtype\":\"f32" + esc + "\",\"shapes\":[[2]],\"reduce_op\":\"sum" + esc + "\"")});
  hostile.replace(hostile.find("\"group\":\"world\""), 15, "\"group\":\"w" + esc + std::string(300, 'x') + "\"");
  hostile.replace(hostile.find("\"reason\":\"request\""), 18, "\"reason\":\"r" + esc + "\"");
  const FlightDump cleaned = parse_flight_dump(hostile);
  const CollectiveRecord& e = cleaned.entries.at(0);
  for (const std::string& printed : {e.op, e.group, e.dtype, e.reduce_op, cleaned.reason, e.describe()}) {
    INFO(printed);
    CHECK(std::none_of(printed.begin(), printed.end(), [](char c) { return c == '\x1b'; }));
  }
  CHECK(e.op == "all_reduce?[2J");
  CHECK(e.group.size() == kMaxLabelBytes);
}

TEST_CASE("flight_dump: a dump is read, and anything else refused with the reason", "[hang_diagnosis]") {
  const FlightDump d = parse_flight_dump(dump_json(3, 4, 1000, {entry(7, "all_reduce", "started", 500)}));
  CHECK(d.rank == 3);
  CHECK(d.world_size == 4);
  REQUIRE(d.entries.size() == 1);
  CHECK(d.entries[0].describe() == "all_reduce #7 (float32[4096], sum)");
  CHECK(d.entries[0].state == CollectiveRecord::State::kStarted);
  CHECK_FALSE(d.entries[0].end_unix_ms);
  CHECK_THROWS_WITH(parse_flight_dump("{\"format\":\"other\"}"), Contains("not a cpprun flight-recorder dump"));
  std::string v2 = dump_json(0, 1, 0, {});
  v2.replace(v2.find("\"version\":1"), 11, "\"version\":2");
  CHECK_THROWS_WITH(parse_flight_dump(v2), Contains("another cpprun release"));
  CHECK_THROWS_WITH(parse_flight_dump(dump_json(0, 1, 0, {entry(1, "all_reduce", "sleeping", 0)})),
                    Contains("unknown state 'sleeping'"));
  CHECK_THROWS_WITH(parse_flight_dump("[1"), Contains("invalid JSON"));
  std::string error;
  CHECK_FALSE(read_flight_dump("/nonexistent/rank_0.json", error));
  CHECK_THAT(error, Contains("no dump at"));
}

TEST_CASE("hang_diagnosis: the rank behind is named with its collective, the others where they wait",
          "[hang_diagnosis]") {
  // Ranks 0-2 went on to all_gather #1043; rank 3 is still in all_reduce #1042.
  const long long now = 1000000;
  const std::string gather = "\"dtype\":\"float32\",\"shapes\":[[1024]],\"reduce_op\":null";
  std::vector<RankEvidence> ranks;
  for (int r = 0; r < 3; ++r) {
    ranks.push_back(evidence(r, dump_json(r, 4, now, {entry(1042, "all_reduce", "completed", now - 30000),
                                                      entry(1043, "all_gather", "started", now - 20500, gather)})));
  }
  ranks.push_back(evidence(3, dump_json(3, 4, now, {entry(1042, "all_reduce", "started", now - 612000)})));
  const Diagnosis d = diagnose(ranks, "SIGUSR1");
  const std::string text = joined(d);
  CHECK_THAT(text, Contains("rank 3 is in all_reduce #1042 (float32[4096], sum) since 612.0 s"));
  CHECK_THAT(text, Contains("ranks 0-2 wait in all_gather #1043 (float32[1024]) since 20.5 s"));
  CHECK_THAT(text, !Contains("disagree"));
  CHECK_THAT(d.json, Contains("\"format\":\"cpprun-hang-diagnosis\""));
  CHECK_THAT(d.json, Contains("\"why\":\"SIGUSR1\""));
  CHECK_NOTHROW(cpprun::detail::parse_json(d.json, 8));
}

TEST_CASE("hang_diagnosis: different calls under one sequence number are named, lowest first", "[hang_diagnosis]") {
  const long long now = 50000;
  const std::string bcast = "\"dtype\":\"float32\",\"shapes\":[[8]],\"reduce_op\":null,\"root_unused\":0";
  std::vector<RankEvidence> ranks = {
      evidence(0, dump_json(0, 2, now, {entry(5, "all_reduce", "started", now - 1000)})),
      evidence(1, dump_json(1, 2, now, {entry(5, "broadcast", "started", now - 900, bcast)})),
  };
  const std::string text = joined(diagnose(ranks, "timeout"));
  CHECK_THAT(text, Contains("ranks disagree at collective #5"));
  CHECK_THAT(text, Contains("rank 0 called all_reduce #5 (float32[4096], sum)"));
  CHECK_THAT(text, Contains("rank 1 called broadcast #5 (float32[8])"));
}

// An uneven all-to-all is one call though each rank's shapes differ (what a sharded save's exchange
// of the bytes each writer is owed records): not a disagreement, where the diagnosis before
// 2026-12-06 said the ranks disagreed there. Another dtype is one.
TEST_CASE("hang_diagnosis: an all_to_all whose shapes differ by rank is one call", "[hang_diagnosis]") {
  const long long now = 50000;
  const auto a2a = [](const std::string& dtype, const std::string& shapes) {
    return "\"dtype\":\"" + dtype + "\",\"shapes\":" + shapes + ",\"reduce_op\":null";
  };
  std::vector<RankEvidence> ranks = {
      evidence(0, dump_json(0, 2, now, {entry(72, "all_to_all", "completed", now - 1000, a2a("uint8", "[[216],[212]]")),
                                        entry(73, "all_reduce", "started", now - 900)})),
      evidence(1, dump_json(1, 2, now, {entry(72, "all_to_all", "completed", now - 1000, a2a("uint8", "[[212],[216]]"))})),
  };
  const std::string text = joined(diagnose(ranks, "timeout"));
  CHECK_THAT(text, !Contains("disagree"));
  CHECK_THAT(text, Contains("rank 1 finished all_to_all #72 (uint8[212], [216])"));
  ranks[1] = evidence(1, dump_json(1, 2, now, {entry(72, "all_to_all", "started", now - 1000,
                                                     a2a("float32", "[[212],[216]]"))}));
  CHECK_THAT(joined(diagnose(ranks, "timeout")), Contains("ranks disagree at collective #72"));
}

TEST_CASE("hang_diagnosis: a rank that exited early, and ranks without dumps, are said so", "[hang_diagnosis]") {
  const long long now = 9000;
  std::vector<RankEvidence> ranks = {
      evidence(0, dump_json(0, 3, now, {entry(1, "all_reduce", "completed", 100), entry(2, "all_reduce", "started", 8000)})),
      evidence(1, dump_json(1, 3, now, {entry(1, "all_reduce", "completed", 100)}), "exited with code 0"),
  };
  RankEvidence gone;
  gone.rank = 2;
  gone.fate = "killed by SIGKILL (Killed)";
  gone.no_dump_reason = "no dump at /run/rank_2.json";
  ranks.push_back(gone);
  const std::string text = joined(diagnose(ranks, "rank 2 was killed"));
  CHECK_THAT(text, Contains("rank 1 finished all_reduce #1"));
  CHECK_THAT(text, Contains("and called no collective in the 8.9 s after it (then exited with code 0)"));
  CHECK_THAT(text, Contains("rank 0 waits in all_reduce #2"));
  CHECK_THAT(text, Contains("no dump from rank 2 (killed by SIGKILL (Killed)): no dump at /run/rank_2.json"));
}

TEST_CASE("hang_diagnosis: all done is not a hang; no dumps at all is said plainly", "[hang_diagnosis]") {
  std::vector<RankEvidence> ranks = {
      evidence(0, dump_json(0, 2, 100, {entry(1, "barrier", "completed", 10, "\"dtype\":\"\",\"shapes\":[]")})),
      evidence(1, dump_json(1, 2, 100, {entry(1, "barrier", "completed", 10, "\"dtype\":\"\",\"shapes\":[]")})),
  };
  CHECK_THAT(joined(diagnose(ranks, "request")), Contains("every rank's last collective completed: none is stuck"));
  // Dumps with nothing in them (a failure before the first collective) claim no collective.
  const std::string before_any =
      joined(diagnose({evidence(0, dump_json(0, 2, 100, {})), evidence(1, dump_json(1, 2, 100, {}))}, "failure"));
  CHECK_THAT(before_any, Contains("no rank recorded a collective or message before the dumps (ranks 0-1 dumped)"));
  CHECK_THAT(before_any, !Contains("last collective completed"));
  RankEvidence none;
  none.rank = 0;
  none.fate = "exited with code 1";
  none.no_dump_reason = "no dump";
  CHECK_THAT(joined(diagnose({none}, "failure")), Contains("no rank left a flight-recorder dump"));
  CHECK(rank_ranges({5, 0, 1, 2, 7, 6}) == "0-2, 5-7");
}

TEST_CASE("hang_diagnosis: one node's part names its own ranks as the world's members", "[hang_diagnosis]") {
  // Node 1 of a 4-rank job (ranks 2-3) diagnosing alone: its world group holds ranks 2 and 3, not 0-1.
  const long long now = 1000000;
  const std::string gather = "\"dtype\":\"float32\",\"shapes\":[[1024]],\"reduce_op\":null";
  const std::vector<RankEvidence> ranks = {
      evidence(2, dump_json(2, 4, now, {entry(5, "all_reduce", "started", now - 55000)})),
      evidence(3, dump_json(3, 4, now, {entry(5, "all_reduce", "completed", now - 55000),
                                        entry(6, "all_gather", "started", now - 54000, gather)}))};
  const std::string text = joined(diagnose(ranks, "asked"));
  CHECK_THAT(text, Contains("group world (ranks 2-3): rank 2 is in all_reduce #5"));
  CHECK_THAT(text, Contains("rank 3 waits in all_gather #6"));
}

TEST_CASE("hang_diagnosis: point-to-point messages are read apart from the collectives", "[hang_diagnosis]") {
  // A pipeline: both ranks finished all_reduce #3; rank 0 sent its activation (#4), rank 1 waits
  // for the gradient rank 0 never receives... as the messages' own numbers say, not the collectives'.
  const long long now = 80000;
  auto message = [](int seq, const std::string& op, const std::string& state, long long start, int peer) {
    std::string e = entry(seq, op, state, start, "\"dtype\":\"float32\",\"shapes\":[[2, 8]],\"reduce_op\":null");
    const std::string null_root = "\"root\":null";
    return e.replace(e.find(null_root), null_root.size(), "\"root\":" + std::to_string(peer));
  };
  std::vector<RankEvidence> ranks = {
      evidence(0, dump_json(0, 2, now, {entry(3, "all_reduce", "completed", now - 9000),
                                        message(4, "send", "completed", now - 8000, 1)})),
      evidence(1, dump_json(1, 2, now, {entry(3, "all_reduce", "completed", now - 9000),
                                        message(4, "recv", "completed", now - 8000, 0),
                                        message(5, "recv", "started", now - 7500, 0)})),
  };
  const std::string text = joined(diagnose(ranks, "timeout"));
  CHECK_THAT(text, !Contains("disagree"));
  CHECK_THAT(text, Contains("group world point-to-point: rank 0 last finished send #4 (float32[2, 8]) to rank 1; "
                            "rank 1 waits in recv #5 (float32[2, 8]) from rank 0 since 7.5 s"));
  // Messages all done say nothing; the collectives' reading stands alone.
  ranks[1] = evidence(1, dump_json(1, 2, now, {entry(3, "all_reduce", "completed", now - 9000),
                                               message(4, "recv", "completed", now - 8000, 0)}));
  CHECK_THAT(joined(diagnose(ranks, "timeout")), !Contains("point-to-point"));
}

TEST_CASE("hang_diagnosis: a message's label names the pipeline stage that waits, and for what",
          "[hang_diagnosis]") {
  const long long now = 80000;
  // entry()'s message with its peer, tag and label where entry() writes a null root.
  auto message = [](int seq, long long start, const std::string& more) {
    std::string e = entry(seq, "recv", "started", start, "\"dtype\":\"float32\",\"shapes\":[[2, 8]],\"reduce_op\":null");
    const std::string null_root = "\"root\":null";
    return e.replace(e.find(null_root), null_root.size(), "\"root\":0" + more);
  };
  const std::string labelled =
      message(4, now - 7500, ",\"tag\":67108869,\"label\":\"pipeline stage 1: the activation of micro-batch 1 from stage 0\"");
  std::vector<RankEvidence> ranks = {
      evidence(0, dump_json(0, 2, now, {entry(3, "all_reduce", "completed", now - 9000)})),
      evidence(1, dump_json(1, 2, now, {entry(3, "all_reduce", "completed", now - 9000), labelled})),
  };
  CHECK_THAT(joined(diagnose(ranks, "timeout")),
             Contains("rank 1 waits in recv #4 (float32[2, 8]) from rank 0 since 7.5 s (pipeline stage 1: the "
                      "activation of micro-batch 1 from stage 0)"));
  const FlightDump dump = parse_flight_dump(dump_json(1, 2, now, {labelled}));
  REQUIRE(dump.entries.size() == 1);
  CHECK(dump.entries[0].tag == 67108869);
  CHECK(dump.entries[0].root == 0);
  // A label longer than a line is cut, not refused; one that is not a string is refused.
  const std::string long_label = message(4, now, ",\"label\":\"" + std::string(5000, 'x') + "\"");
  CHECK(parse_flight_dump(dump_json(1, 2, now, {long_label})).entries[0].label.size() == kMaxLabelBytes);
  CHECK_THROWS_WITH(parse_flight_dump(dump_json(1, 2, now, {message(4, now, ",\"label\":7")})),
                    Contains("\"label\" is not a string"));
  // A worker's control characters cannot forge the diagnosis's lines.
  CHECK(parse_flight_dump(dump_json(1, 2, now, {message(4, now, ",\"label\":\"a\\nrank 0 is fine\"")}))
            .entries[0]
            .label == "a?rank 0 is fine");
  // A dump of before labels (no "tag", no "label") is read as before.
  CHECK(parse_flight_dump(dump_json(1, 2, now, {message(4, now, "")})).entries[0].label.empty());
}

TEST_CASE("hang_diagnosis: the library call each rank ran a collective for is said, never compared",
          "[hang_diagnosis]") {
  const long long now = 90000;
  auto in_call = [](int seq, const std::string& state, long long start, const std::string& extra,
                    const std::string& call) {
    std::string e = entry(seq, "all_reduce", state, start, extra);
    const std::string null_root = "\"root\":null";
    return e.replace(e.find(null_root), null_root.size(), null_root + ",\"public_call\":\"" + call + "\"");
  };
  const std::string training = "\"dtype\":\"float32\",\"shapes\":[[10]],\"reduce_op\":\"sum\"";
  const std::string saving = "\"dtype\":\"int32\",\"shapes\":[[2]],\"reduce_op\":\"sum\"";
  // Rank 0 saved alone: its all_reduce #3 is the save's, rank 1's the backward's.
  std::vector<RankEvidence> ranks = {
      evidence(0, dump_json(0, 2, now, {in_call(3, "started", now - 6000, saving, "cpprun::save_state_dict")})),
      evidence(1, dump_json(1, 2, now, {in_call(3, "started", now - 6000, training,
                                                "DistributedDataParallel's backward")})),
  };
  const std::string said = joined(diagnose(ranks, "timeout"));
  CHECK_THAT(said, Contains("all_reduce #3 (int32[2], sum) in cpprun::save_state_dict"));
  CHECK_THAT(said, Contains("all_reduce #3 (float32[10], sum) in DistributedDataParallel's backward"));
  CHECK_THAT(said, Contains("disagree"));
  // The same collective reached from two library calls is no disagreement.
  ranks = {
      evidence(0, dump_json(0, 2, now, {in_call(3, "started", now - 6000, training, "cpprun::clip_grad_norm_")})),
      evidence(1, dump_json(1, 2, now, {in_call(3, "started", now - 6000, training,
                                                "DistributedDataParallel::clip_grad_norm")})),
  };
  CHECK_THAT(joined(diagnose(ranks, "timeout")), !Contains("disagree"));
  // Not a string: refused, as the label.
  std::string numbered = entry(3, "all_reduce", "started", now, training);
  numbered.replace(numbered.find("\"root\":null"), 11, "\"root\":null,\"public_call\":7");
  CHECK_THROWS_WITH(parse_flight_dump(dump_json(1, 2, now, {numbered})), Contains("\"public_call\" is not a string"));
}
