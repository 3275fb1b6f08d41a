// Unit tests of --redirects/--tee/--local_ranks_filter parsing and of each stream's destination.
#include "catch.h"

#include <string>
#include <vector>

#include "command_line/launch_config.h"
#include "command_line/output_spec.h"
#include "usage_error_text.h"

using namespace cpprun::launcher;
using Catch::Matchers::Contains;

namespace {

using S = StdStreams;

std::string spec_error(const std::string& text, int nproc) {
  INFO("--redirects " << text);
  return usage_error_text([&] { parse_std_spec("--redirects", text, nproc); });
}

// The role torchrun calls "default" (--role's default).
WorkerOutputSpec plan_worker_output_default(const OutputOptions& o, int local_rank, int rank, const std::string& dir) {
  return plan_worker_output(o, "default", local_rank, rank, dir);
}

OutputOptions options(std::vector<S> redirects, std::vector<S> tee, std::vector<bool> shown = {}) {
  OutputOptions o;
  o.redirects = std::move(redirects);
  o.tee = std::move(tee);
  o.shown = std::move(shown);
  o.log_dir = "logs";
  return o;
}

}  // namespace

TEST_CASE("output_spec: a single value applies to every local rank", "[output_spec]") {
  CHECK(parse_std_spec("--tee", "0", 2) == std::vector<S>{S::kNone, S::kNone});
  CHECK(parse_std_spec("--tee", "1", 2) == std::vector<S>{S::kOut, S::kOut});
  CHECK(parse_std_spec("--tee", "2", 1) == std::vector<S>{S::kErr});
  CHECK(parse_std_spec("--tee", "3", 3) == std::vector<S>{S::kAll, S::kAll, S::kAll});
}

TEST_CASE("output_spec: torchrun's map sets ranks one by one, the rest get 0", "[output_spec]") {
  CHECK(parse_std_spec("--redirects", "0:1,2:3", 4) == std::vector<S>{S::kOut, S::kNone, S::kAll, S::kNone});
  CHECK(parse_std_spec("--redirects", "1:2", 2) == std::vector<S>{S::kNone, S::kErr});
  // Unlike torchrun's regex, local ranks above 9 are fine.
  CHECK(parse_std_spec("--redirects", "10:1", 11).at(10) == S::kOut);
}

TEST_CASE("output_spec: bad values name the flag, the text and the fix", "[output_spec]") {
  for (const char* text : {"4", "-1", "", "x", "0:4", "0:", ":1", "0:1,", "0=1", "0:1;1:2"}) {
    INFO(text);
    CHECK_THAT(spec_error(text, 2), Contains(std::string("--redirects=") + text) && Contains("expected"));
  }
  CHECK_THAT(spec_error("2:1", 2), Contains("local rank 2") && Contains("--nproc_per_node=2"));
}

TEST_CASE("output_spec: --local_ranks_filter lists the ranks shown", "[output_spec]") {
  CHECK(parse_local_ranks_filter("", 3) == std::vector<bool>{true, true, true});
  CHECK(parse_local_ranks_filter("0,2", 3) == std::vector<bool>{true, false, true});
  CHECK(parse_local_ranks_filter("1", 2) == std::vector<bool>{false, true});
  REQUIRE_THROWS_WITH(parse_local_ranks_filter("3", 2),
                      Contains("--local_ranks_filter=3") && Contains("0 to 1"));
  REQUIRE_THROWS_WITH(parse_local_ranks_filter("0,,1", 2), Contains("--local_ranks_filter=0,,1"));
  REQUIRE_THROWS_AS(parse_local_ranks_filter("a", 2), UsageError);
  // As torchrun's int(): blanks around a number and a leading '+' (it refused "0, 1").
  CHECK(parse_local_ranks_filter("0, 1", 3) == std::vector<bool>{true, true, false});
  CHECK(parse_local_ranks_filter(" +2 ", 3) == std::vector<bool>{false, false, true});
  REQUIRE_THROWS_AS(parse_local_ranks_filter("+", 2), UsageError);
  REQUIRE_THROWS_AS(parse_local_ranks_filter("1 1", 2), UsageError);
  // --redirects keeps torchrun's digits-only pattern.
  REQUIRE_THROWS_AS(parse_std_spec("--redirects", "0: 1", 2), UsageError);
  REQUIRE_THROWS_AS(parse_std_spec("--redirects", "+1", 2), UsageError);
}

TEST_CASE("output_spec: defaults send both streams to the console, prefixed with the global rank",
          "[output_spec]") {
  const WorkerOutputSpec spec = plan_worker_output_default(OutputOptions{}, 1, 5, "logs/attempt_0/1");
  CHECK(spec.prefix == "[rank5]: ");
  CHECK(spec.worker_own_prefix == "[rank5]: ");  // torch.distributed's excepthook writes it
  CHECK(spec.out.console);
  CHECK(spec.err.console);
  CHECK(spec.out.file.empty());
  CHECK(spec.err.file.empty());
  CHECK_FALSE(OutputOptions{}.writes_files());
}

TEST_CASE("output_spec: --redirects moves streams to files, --tee copies them", "[output_spec]") {
  const std::string dir = "logs/attempt_2/0";
  SECTION("redirect stdout") {
    const WorkerOutputSpec spec = plan_worker_output_default(options({S::kOut}, {S::kNone}), 0, 0, dir);
    CHECK_FALSE(spec.out.console);
    CHECK(spec.out.file == dir + "/stdout.log");
    CHECK(spec.err.console);
    CHECK(spec.err.file.empty());
  }
  SECTION("tee both") {
    const WorkerOutputSpec spec = plan_worker_output_default(options({S::kNone}, {S::kAll}), 0, 0, dir);
    CHECK(spec.out.console);
    CHECK(spec.out.file == dir + "/stdout.log");
    CHECK(spec.err.console);
    CHECK(spec.err.file == dir + "/stderr.log");
  }
  SECTION("tee wins over redirects for the console, as in torchrun") {
    const WorkerOutputSpec spec = plan_worker_output_default(options({S::kAll}, {S::kErr}), 0, 0, dir);
    CHECK_FALSE(spec.out.console);
    CHECK(spec.err.console);
    CHECK(spec.err.file == dir + "/stderr.log");
  }
  SECTION("a tee'd stream's console lines carry torchrun's prefix, [ROLE LOCAL_RANK]:") {
    const WorkerOutputSpec spec =
        plan_worker_output(options({S::kNone, S::kNone}, {S::kNone, S::kOut}), "trainer", 1, 7, dir);
    CHECK(spec.out.tee);
    CHECK_FALSE(spec.err.tee);
    CHECK(spec.tee_prefix == "[trainer1]:");  // torchrun's TailLog: no space, the local rank
    CHECK(spec.prefix == "[rank7]: ");        // the stream not tee'd keeps cpprun's
  }
  CHECK(options({S::kNone, S::kErr}, {S::kNone, S::kNone}).writes_files());
  CHECK(options({S::kNone}, {S::kOut}).writes_files());
  CHECK_FALSE(options({S::kNone}, {S::kNone}).writes_files());
}

TEST_CASE("output_spec: --local_ranks_filter keeps other ranks off the console, not out of files",
          "[output_spec]") {
  const OutputOptions o = options({S::kNone, S::kNone}, {S::kAll, S::kAll}, {true, false});
  const WorkerOutputSpec hidden = plan_worker_output_default(o, 1, 1, "d");
  CHECK_FALSE(hidden.out.console);
  CHECK_FALSE(hidden.err.console);
  CHECK(hidden.out.file == "d/stdout.log");
  CHECK(hidden.err.file == "d/stderr.log");
  CHECK(plan_worker_output_default(o, 0, 0, "d").out.console);
}

TEST_CASE("output_spec: --log_line_prefix_template substitutes as Python's Template.safe_substitute",
          "[output_spec]") {
  const PrefixFields f{"default", 5, 1, "r12i0n8"};
  CHECK(render_prefix_template("[${role_name}${local_rank}]:", f) == "[default1]:");  // torchrun's own default
  CHECK(render_prefix_template("${hostname}:${rank}: ", f) == "r12i0n8:5: ");
  CHECK(render_prefix_template("$rank|$local_rank", f) == "5|1");
  CHECK(render_prefix_template("$$rank", f) == "$rank");
  // Unknown names, unclosed braces and a lone $ stay as written.
  CHECK(render_prefix_template("${nope} $nope ${rank $", f) == "${nope} $nope ${rank $");
  CHECK(render_prefix_template("$ranks", f) == "$ranks");
}

TEST_CASE("output_spec: --duplicate_*_filters apply to the shown ranks' tee'd streams, into the attempt dir",
          "[output_spec]") {
  CHECK(parse_duplicate_filters("").empty());
  CHECK(parse_duplicate_filters("a,b") == std::vector<std::string>{"a", "b"});
  CHECK(parse_duplicate_filters("a,,b,c") == std::vector<std::string>{"a,b", "c"});
  OutputOptions options;
  options.tee = {S::kOut, S::kAll, S::kNone};
  options.shown = {true, false, true};
  options.duplicate_stdout_filters = {"loss"};
  options.duplicate_stderr_filters = {"warn"};
  const WorkerOutputSpec r0 = plan_worker_output_default(options, 0, 0, "d/attempt_1/0");
  CHECK(r0.out.filtered_file == "d/attempt_1/filtered_stdout.log");
  CHECK(r0.out.filters == std::vector<std::string>{"loss"});
  CHECK(r0.err.filtered_file.empty());  // stderr not tee'd
  CHECK(plan_worker_output_default(options, 1, 1, "d/attempt_1/1").out.filtered_file.empty());  // hidden rank
  CHECK(plan_worker_output_default(options, 2, 2, "d/attempt_1/2").out.filtered_file.empty());  // not tee'd
}
