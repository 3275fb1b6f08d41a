// Unit tests of --dry_run's report and of the worker specs it prints (the ones a real run starts).
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "command_line/launch_config.h"
#include "workers/worker_specs.h"

using namespace cpprun::launcher;
using Catch::Matchers::Contains;

namespace {

LaunchConfig config_with(int nproc) {
  LaunchConfig c;
  c.nproc_per_node = nproc;
  c.program = "./train";
  c.program_args = {"--lr", "0.1", "a b"};
  return c;
}

}  // namespace

TEST_CASE("dry_run: shell quoting only where needed", "[dry_run]") {
  CHECK(shell_quote("--lr=0.1") == "--lr=0.1");
  CHECK(shell_quote("a b") == "'a b'");
  CHECK(shell_quote("") == "''");
  CHECK(shell_quote("it's") == "'it'\\''s'");
  CHECK(shell_quote("$HOME") == "'$HOME'");
}

// ./train resolved to /abs/train, with config_with's arguments.
ProgramCommand train() { return {"/abs/train", {"./train", "--lr", "0.1", "a b"}, ""}; }

TEST_CASE("dry_run: worker specs carry the command, env, error file and output plan", "[dry_run]") {
  const LaunchConfig c = config_with(2);
  const std::vector<WorkerSpec> specs = make_worker_specs(worker_settings(c), single_node_layout(2), train(), 1, {"/run", true}, {});
  REQUIRE(specs.size() == 2);
  const WorkerSpec& w = specs[1];
  CHECK(w.rank == 1);
  CHECK(w.command.path == "/abs/train");
  CHECK(w.command.argv == std::vector<std::string>{"./train", "--lr", "0.1", "a b"});
  CHECK(w.error_file == "/run/attempt_1/1/error.json");
  CHECK(std::count(w.command.env.begin(), w.command.env.end(),
                   "TORCHELASTIC_ERROR_FILE=/run/attempt_1/1/error.json") == 1);
  CHECK(w.output.prefix == "[rank1]: ");
}

TEST_CASE("dry_run: prints each rank's command and only the variables cpprun sets", "[dry_run]") {
  LaunchConfig c = config_with(2);
  c.output.redirects = {StdStreams::kNone, StdStreams::kOut};
  c.output.tee = {StdStreams::kNone, StdStreams::kNone};
  c.output.log_dir = "logs";
  const EnvMap parent = {{"PATH", "/bin"}, {"OMP_NUM_THREADS", "4"}, {"RANK", "7"}};
  const std::string text =
      format_dry_run(make_worker_specs(worker_settings(c), single_node_layout(2), train(), 0, {"logs", true}, parent),
                     parent);
  CHECK_THAT(text, Contains("2 workers would start; nothing was started"));
  CHECK_THAT(text, Contains("rank 1 (local_rank 1):\n  command: ./train --lr 0.1 'a b'\n  program: /abs/train"));
  CHECK_THAT(text, Contains("  stdout: logs/attempt_0/1/stdout.log\n"));
  CHECK_THAT(text, Contains("  stderr: console, lines prefixed '[rank1]: '\n"));
  CHECK_THAT(text, Contains("    RANK=1\n"));  // changed from the parent's 7
  CHECK_THAT(text, Contains("    TORCHELASTIC_ERROR_FILE=logs/attempt_0/0/error.json\n"));
  CHECK(text.find("PATH=") == std::string::npos);             // inherited unchanged
  CHECK(text.find("OMP_NUM_THREADS") == std::string::npos);  // the user's own
}
