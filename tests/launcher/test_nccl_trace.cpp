// Unit tests of naming PyTorch's NCCL flight-recorder dumps in a diagnosis: which files, bounded, and
// the command that reads them; a missing or odd directory never breaks it.
#include "catch.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "diagnosis/nccl_trace.h"
#include "scratch_dir.h"

using namespace cpprun::launcher;
using Catch::Matchers::Contains;

using Scratch = launcher_test::ScratchDir;

TEST_CASE("nccl_trace: no dir, a missing dir, an empty dir: nothing to say", "[nccl_trace]") {
  Scratch scratch;
  for (const std::string& dir : {std::string(), scratch.path + "/none", scratch.path}) {
    const NcclTraceListing listing = list_nccl_traces(dir);
    CHECK(listing.files.empty());
    CHECK(listing.error.empty());
    CHECK(nccl_trace_lines(listing).empty());
  }
}

TEST_CASE("nccl_trace: the ranks that dumped, their files, and torchfrtrace's command", "[nccl_trace]") {
  Scratch scratch;
  std::ofstream(scratch.path + "/rank_10") << "0123456789";
  std::ofstream(scratch.path + "/rank_2") << "ab";
  std::ofstream(scratch.path + "/rank_3") << "";
  std::ofstream(scratch.path + "/notes.txt") << "x";
  REQUIRE(mkdir((scratch.path + "/sub").c_str(), 0700) == 0);  // not a dump
  const NcclTraceListing listing = list_nccl_traces(scratch.path);
  REQUIRE(listing.files.size() == 4);
  CHECK(listing.files[0].name == "rank_2");
  CHECK(listing.files[1].name == "rank_3");
  CHECK(listing.files[2].name == "rank_10");
  CHECK(listing.files[2].bytes == 10);
  CHECK(listing.files[3].name == "notes.txt");
  CHECK(listing.files[3].rank == -1);
  const std::vector<std::string> lines = nccl_trace_lines(listing);
  REQUIRE(lines.size() == 2);
  CHECK_THAT(lines[0], Contains("ranks 2-3, 10 dumped their traces in " + scratch.path + ": rank_2 (2 B), rank_3 (0 B), "
                                "rank_10 (10 B), notes.txt (1 B)"));
  CHECK_THAT(lines[1], Contains("torchfrtrace " + scratch.path + " -p rank_"));
  const std::string json = nccl_trace_json(listing);
  CHECK_THAT(json, Contains("\"ranks\":[2,3,10]"));
  CHECK_THAT(json, Contains("\"command\":\"torchfrtrace " + scratch.path + " -p rank_\""));
  CHECK_THAT(json, Contains("{\"name\":\"notes.txt\",\"rank\":null,\"bytes\":1}"));
}

TEST_CASE("nccl_trace: many files and huge names are bounded; odd names are not ranks", "[nccl_trace]") {
  Scratch scratch;
  for (int rank = 0; rank < 40; ++rank) std::ofstream(scratch.path + "/rank_" + std::to_string(rank)) << "x";
  const std::string huge = "rank_" + std::string(200, '7');
  std::ofstream(scratch.path + "/" + huge) << "x";
  std::ofstream(scratch.path + "/rank_-1") << "x";
  const NcclTraceListing listing = list_nccl_traces(scratch.path);
  CHECK(listing.files.size() == kNcclTraceListLimit);
  CHECK(listing.unlisted == 42 - kNcclTraceListLimit);
  CHECK(listing.files.front().name == "rank_0");
  const std::vector<std::string> lines = nccl_trace_lines(listing);
  CHECK_THAT(lines[0], Contains("ranks 0-15 dumped") && Contains("and 26 more"));
  CHECK(lines[0].size() < 2000);
  // The huge name is not a rank (too many digits) and would be cut if listed.
  Scratch one;
  std::ofstream(one.path + "/" + huge) << "x";
  const NcclTraceListing odd = list_nccl_traces(one.path);
  REQUIRE(odd.files.size() == 1);
  CHECK(odd.files[0].rank == -1);
  CHECK(odd.files[0].name.size() == kNcclTraceNameLimit + 3);
}

TEST_CASE("nccl_trace: a dir that cannot be read is said, never thrown", "[nccl_trace]") {
  Scratch scratch;
  std::ofstream(scratch.path + "/file") << "x";
  const NcclTraceListing listing = list_nccl_traces(scratch.path + "/file");  // not a directory
  CHECK(listing.files.empty());
  CHECK_FALSE(listing.error.empty());
  const std::vector<std::string> lines = nccl_trace_lines(listing);
  REQUIRE(lines.size() == 1);
  CHECK_THAT(lines[0], Contains("cannot read " + scratch.path + "/file"));
}

TEST_CASE("nccl_trace: the command quotes a dir with spaces for the shell", "[nccl_trace]") {
  CHECK(torchfrtrace_command("/logs/a b/attempt_0/nccl_flight_recorder") ==
        "torchfrtrace '/logs/a b/attempt_0/nccl_flight_recorder' -p rank_");
}
