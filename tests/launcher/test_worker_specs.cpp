// Unit tests of the worker specs: torchrun's variables, rank arithmetic and user overrides in
// each worker's environment, and --dry_run's report of the specs a real run starts.
#include "catch.h"

#include <algorithm>
#include <string>
#include <vector>

#include "command_line/launch_config.h"
#include "workers/rank_layout.h"
#include "cpprun/launcher_contract.h"
#include "workers/worker_specs.h"

using namespace cpprun::launcher;
using Catch::Matchers::Contains;

namespace {

WorkerEnvSettings config_with(int nproc) {
  WorkerEnvSettings c;
  c.local_world_size = nproc;
  return c;
}

// The single-node environment of local rank `local_rank`.
EnvMap env_of(const WorkerEnvSettings& c, int local_rank, int restart, const std::string& error_file,
              const EnvMap& parent) {
  return make_worker_env(c, single_node_layout(c.local_world_size), local_rank, restart, error_file, parent);
}

LaunchConfig launch_config_with(int nproc) {
  LaunchConfig c;
  c.nproc_per_node = nproc;
  c.program = "./train";
  c.program_args = {"--lr", "0.1", "a b"};
  return c;
}

// ./train resolved to /abs/train, with launch_config_with's arguments.
ProgramCommand train() { return {"/abs/train", {"./train", "--lr", "0.1", "a b"}, ""}; }

}  // namespace

TEST_CASE("worker_specs: the environment sets every torchrun variable", "[worker_specs]") {
  WorkerEnvSettings c = config_with(3);
  c.master_addr = "10.0.0.5";
  c.master_port = 1234;
  c.max_restarts = 4;
  c.run_id = "job9";
  c.role = "trainer";
  const EnvMap env = env_of(c, 2, 1, "/run/e.json", {{"OMP_NUM_THREADS", "8"}});
  const EnvMap expected_subset = {
      {"RANK", "2"},
      {"LOCAL_RANK", "2"},
      {"WORLD_SIZE", "3"},
      {"LOCAL_WORLD_SIZE", "3"},
      {"GROUP_RANK", "0"},
      {"GROUP_WORLD_SIZE", "1"},
      {"ROLE_RANK", "2"},
      {"ROLE_WORLD_SIZE", "3"},
      {"ROLE_NAME", "trainer"},
      {"MASTER_ADDR", "10.0.0.5"},
      {"MASTER_PORT", "1234"},
      {"TORCHELASTIC_RESTART_COUNT", "1"},
      {"TORCHELASTIC_MAX_RESTARTS", "4"},
      {"TORCHELASTIC_RUN_ID", "job9"},
      {"TORCHELASTIC_USE_AGENT_STORE", "True"},
      {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"},
      {"OMP_NUM_THREADS", "8"},
      {"TORCHELASTIC_SIGNALS_TO_HANDLE", "SIGTERM,SIGINT,SIGHUP,SIGQUIT"},  // torchrun's launcher exports it
  };
  for (const auto& [name, value] : expected_subset) {
    INFO(name);
    REQUIRE(env.count(name) == 1);
    CHECK(env.at(name) == value);
  }
  // torchrun 2.x sets only the TORCH_ name; LibTorch warns in every NCCL worker about the old one.
  CHECK(env.count("NCCL_ASYNC_ERROR_HANDLING") == 0);
}

TEST_CASE("worker_specs: multi-node ranks come from the rendezvous's layout", "[worker_specs]") {
  // Node 1 of three nodes running 2, 4 and 1 workers.
  WorkerEnvSettings c = config_with(4);
  const RankLayout layout = multi_node_layout({{2, "default"}, {4, "default"}, {1, "default"}}, 1);
  const EnvMap env = make_worker_env(c, layout, 3, 0, "/run/e.json", {});
  CHECK(env.at("RANK") == "5");
  CHECK(env.at("ROLE_RANK") == "5");
  CHECK(env.at("LOCAL_RANK") == "3");
  CHECK(env.at("LOCAL_WORLD_SIZE") == "4");
  CHECK(env.at("WORLD_SIZE") == "7");
  CHECK(env.at("ROLE_WORLD_SIZE") == "7");
  CHECK(env.at("GROUP_RANK") == "1");
  CHECK(env.at("GROUP_WORLD_SIZE") == "3");
  // Node 0's agent hosts the store (its keeper), on the port it bound (Note [Workers' store]).
  CHECK(env.at("TORCHELASTIC_USE_AGENT_STORE") == "True");
}

TEST_CASE("worker_specs: c10d workers get the endpoint's host and the rendezvous's MASTER_PORT", "[worker_specs]") {
  WorkerEnvSettings c = config_with(1);
  c.master_addr = "node0";  // --rdzv_endpoint=node0:29400
  c.master_port = 29400;
  c.run_id = "job42";
  RankLayout layout = multi_node_layout({{2, "default"}, {1, "default"}}, 1);
  layout.master_port = 41234;
  const EnvMap env = make_worker_env(c, layout, 0, 0, "/run/e.json", {});
  CHECK(env.at("RANK") == "2");
  CHECK(env.at("MASTER_ADDR") == "node0");
  CHECK(env.at("MASTER_PORT") == "41234");
  CHECK(env.at("TORCHELASTIC_RUN_ID") == "job42");
  // The hosting agent's store keeper serves the workers' store, as torchrun's agent does.
  CHECK(env.at("TORCHELASTIC_USE_AGENT_STORE") == "True");
  // The hosting agent's --local_addr, sent with the round's start, is the workers' MASTER_ADDR.
  layout.master_addr = "10.0.0.7";
  CHECK(make_worker_env(c, layout, 0, 0, "/run/e.json", {}).at("MASTER_ADDR") == "10.0.0.7");
  // Not tunnelled (--no_job_secret): the library may read a loopback MASTER_ADDR as "one host".
  CHECK(env.count(cpprun::contract::kStoreTunnelVariable) == 0);
  // Tunnelled: the loopback MASTER_ADDR is this node's end of the tunnel, and the library is told.
  layout.store_tunnelled = true;
  layout.master_addr = "127.0.0.1";
  const EnvMap tunnelled = make_worker_env(c, layout, 0, 0, "/run/e.json", {});
  CHECK(tunnelled.at("MASTER_ADDR") == "127.0.0.1");
  CHECK(tunnelled.at(cpprun::contract::kStoreTunnelVariable) == "1");
  // A cpprun started by a tunnelled worker inherits the variable; its own untunnelled job's workers
  // must not see it.
  layout.store_tunnelled = false;
  const EnvMap inherited{{cpprun::contract::kStoreTunnelVariable, "1"}};
  CHECK(make_worker_env(c, layout, 0, 0, "/run/e.json", inherited).count(cpprun::contract::kStoreTunnelVariable) == 0);
  CHECK(env_of(config_with(1), 0, 0, "/run/e.json", inherited).count(cpprun::contract::kStoreTunnelVariable) == 0);
}

TEST_CASE("worker_specs: the environment inherits the launcher's, launcher variables winning", "[worker_specs]") {
  const EnvMap env = env_of(config_with(1), 0, 0, "/run/e.json", {{"PATH", "/x"}, {"RANK", "99"}});
  CHECK(env.at("PATH") == "/x");
  CHECK(env.at("RANK") == "0");
}

TEST_CASE("worker_specs: workers do not inherit the job secret", "[worker_specs]") {
  const EnvMap env =
      env_of(config_with(1), 0, 0, "/run/e.json", {{"CPPRUN_JOB_SECRET", "s3cret-s3cret-s3cret"}, {"HOME", "/h"}});
  CHECK(env.count("CPPRUN_JOB_SECRET") == 0);
  CHECK(env.at("HOME") == "/h");
}

TEST_CASE("worker_specs: TORCHELASTIC_USE_AGENT_STORE is the launcher's, as torchrun's", "[worker_specs]") {
  // The agent hosts the store whatever cpprun's environment says (Note [Store keeper]).
  const EnvMap env = env_of(config_with(1), 0, 0, "/run/e.json", {{"TORCHELASTIC_USE_AGENT_STORE", "False"}});
  CHECK(env.at("TORCHELASTIC_USE_AGENT_STORE") == "True");
}

TEST_CASE("worker_specs: the store keeper gets cpprun's environment but the job secret", "[worker_specs]") {
  const EnvMap env = make_keeper_env(
      {{"CPPRUN_JOB_SECRET", "s3cret-s3cret-s3cret"}, {"CPPRUN_JOB_TOKEN", "t0ken"}, {"PATH", "/x"}});
  CHECK(env.count("CPPRUN_JOB_SECRET") == 0);
  CHECK(env.at("CPPRUN_JOB_TOKEN") == "t0ken");  // the guardian finds it by the token
  CHECK(env.at("PATH") == "/x");
}

TEST_CASE("worker_specs: the user's TORCH_NCCL_ASYNC_ERROR_HANDLING wins; the old name alone does not stop cpprun's, as torchrun's", "[worker_specs]") {
  const EnvMap env = env_of(config_with(2), 0, 0, "/run/e.json",
                                     {{"TORCH_NCCL_ASYNC_ERROR_HANDLING", "3"}, {"NCCL_ASYNC_ERROR_HANDLING", "0"}});
  CHECK(env.at("TORCH_NCCL_ASYNC_ERROR_HANDLING") == "3");
  CHECK(env.at("NCCL_ASYNC_ERROR_HANDLING") == "0");
  // The old name alone: torchrun's agent reads only the TORCH_ name, so it still sets it to 1
  // (local_elastic_agent.py), which LibTorch reads first; the old one is passed on untouched.
  const EnvMap old_only = env_of(config_with(2), 0, 0, "/run/e.json", {{"NCCL_ASYNC_ERROR_HANDLING", "0"}});
  CHECK(old_only.at("NCCL_ASYNC_ERROR_HANDLING") == "0");
  CHECK(old_only.at("TORCH_NCCL_ASYNC_ERROR_HANDLING") == "1");
}

TEST_CASE("worker_specs: OMP_NUM_THREADS=1 only when unset and several workers share the node",
          "[worker_specs]") {
  CHECK(defaults_omp_threads(2, {}));
  CHECK(env_of(config_with(2), 0, 0, "/run/e.json", {}).at("OMP_NUM_THREADS") == "1");

  CHECK_FALSE(defaults_omp_threads(1, {}));
  CHECK(env_of(config_with(1), 0, 0, "/run/e.json", {}).count("OMP_NUM_THREADS") == 0);

  // Set, even to the empty string, means the user chose.
  CHECK_FALSE(defaults_omp_threads(2, {{"OMP_NUM_THREADS", ""}}));
  CHECK(env_of(config_with(2), 0, 0, "/run/e.json", {{"OMP_NUM_THREADS", "4"}}).at("OMP_NUM_THREADS") ==
        "4");
}

TEST_CASE("worker_specs: TORCHELASTIC_ERROR_FILE is the launcher's path, whatever the user set",
          "[worker_specs]") {
  const EnvMap env = env_of(config_with(2), 1, 0, "/run/attempt_0/1/error.json",
                                     {{"TORCHELASTIC_ERROR_FILE", "/elsewhere"}});
  CHECK(env.at("TORCHELASTIC_ERROR_FILE") == "/run/attempt_0/1/error.json");
}

TEST_CASE("worker_specs: the environment's execve strings are NAME=value", "[worker_specs]") {
  CHECK(to_env_strings({{"A", "1"}, {"B", "x=y"}}) == std::vector<std::string>{"A=1", "B=x=y"});
}

TEST_CASE("worker_specs: --dry_run shell-quotes only where needed", "[worker_specs]") {
  CHECK(shell_quote("--lr=0.1") == "--lr=0.1");
  CHECK(shell_quote("a b") == "'a b'");
  CHECK(shell_quote("") == "''");
  CHECK(shell_quote("it's") == "'it'\\''s'");
  CHECK(shell_quote("$HOME") == "'$HOME'");
}

// Note [torchrun's ${local_rank} in the program's arguments]: each expected value is what Python's
// string.Template(arg).safe_substitute(local_rank=3) gives (checked with Python 3.11), but for `$$`,
// which cpprun keeps (Template makes it `$`).
TEST_CASE("worker_specs: ${local_rank} in the program's arguments is each worker's, as torchrun substitutes it",
          "[worker_specs]") {
  CHECK(substitute_local_rank("out_${local_rank}.log", 3) == "out_3.log");
  CHECK(substitute_local_rank("$local_rank", 3) == "3");
  CHECK(substitute_local_rank("a$$b", 3) == "a$$b");                  // Template: a$b
  CHECK(substitute_local_rank("echo $$ >pid", 3) == "echo $$ >pid");  // Template: echo $ >pid
  CHECK(substitute_local_rank("$$local_rank $$${local_rank}", 3) == "$$local_rank $$3");
  CHECK(substitute_local_rank("$local_rank2 ${local_rank}2", 3) == "$local_rank2 32");
  CHECK(substitute_local_rank("$LOCAL_RANK $HOME ${x} ${local_rank", 3) == "$LOCAL_RANK $HOME ${x} ${local_rank");
  CHECK(substitute_local_rank("$ $1 ${} $", 3) == "$ $1 ${} $");
  CHECK(substitute_local_rank("no dollars", 3) == "no dollars");
  const LaunchConfig c = launch_config_with(2);
  const ProgramCommand program{"/abs/train", {"./train_${local_rank}", "--out=log_${local_rank}.txt", "a$$b"}, ""};
  const std::vector<WorkerSpec> specs =
      make_worker_specs(worker_settings(c), single_node_layout(2), program, 0, {"/run", true}, {});
  REQUIRE(specs.size() == 2);
  // argv[0], what is executed, is left as torchrun leaves its entrypoint.
  CHECK(specs[0].command.argv == std::vector<std::string>{"./train_${local_rank}", "--out=log_0.txt", "a$$b"});
  CHECK(specs[1].command.argv == std::vector<std::string>{"./train_${local_rank}", "--out=log_1.txt", "a$$b"});
}

TEST_CASE("worker_specs: specs carry the command, env, error file and output plan", "[worker_specs]") {
  const LaunchConfig c = launch_config_with(2);
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

TEST_CASE("worker_specs: under a relative --log_dir the dump variables are absolute, the error file as torchrun's",
          "[worker_specs]") {
  const LaunchConfig c = launch_config_with(1);
  const RunLayout files{"logs/job_abc", true, "/tmp/cpprun-x", true, "/home/u/exp"};
  const std::vector<WorkerSpec> specs =
      make_worker_specs(worker_settings(c), single_node_layout(1), train(), 0, files, {});
  REQUIRE(specs.size() == 1);
  const auto has = [&](const std::string& entry) {
    return std::count(specs[0].command.env.begin(), specs[0].command.env.end(), entry) == 1;
  };
  CHECK(has("TORCH_FR_DUMP_TEMP_FILE=/home/u/exp/logs/job_abc/attempt_0/nccl_flight_recorder/rank_"));
  CHECK(has("TORCH_NCCL_DEBUG_INFO_TEMP_FILE=/home/u/exp/logs/job_abc/attempt_0/nccl_flight_recorder/rank_"));
  const std::string dumps = "/home/u/exp/logs/job_abc/attempt_0/flight_recorder";
  CHECK(has(std::string(cpprun::contract::kFlightRecorderDirVariable) + "=" + dumps));
  CHECK(has("TORCHELASTIC_ERROR_FILE=logs/job_abc/attempt_0/0/error.json"));  // relative under torchrun too
}

TEST_CASE("worker_specs: --dry_run prints each rank's command and only the variables cpprun sets", "[worker_specs]") {
  LaunchConfig c = launch_config_with(2);
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

TEST_CASE("worker_specs: --virtual_local_rank gives LOCAL_RANK=0 and one GPU each, as torchrun", "[worker_specs]") {
  WorkerEnvSettings c = config_with(3);
  c.virtual_local_rank = true;
  // Without CUDA_VISIBLE_DEVICES, local rank i gets GPU i.
  EnvMap env = env_of(c, 2, 0, "e", {});
  CHECK(env.at("LOCAL_RANK") == "0");
  CHECK(env.at("RANK") == "2");
  CHECK(env.at("CUDA_VISIBLE_DEVICES") == "2");
  // With it, the i-th entry (trimmed).
  env = env_of(c, 1, 0, "e", {{"CUDA_VISIBLE_DEVICES", "4, 6,7"}});
  CHECK(env.at("CUDA_VISIBLE_DEVICES") == "6");
  // HIP_VISIBLE_DEVICES wins and is narrowed too.
  env = env_of(c, 2, 0, "e", {{"HIP_VISIBLE_DEVICES", "1,3,5"}, {"CUDA_VISIBLE_DEVICES", "0,1,2"}});
  CHECK(env.at("CUDA_VISIBLE_DEVICES") == "5");
  CHECK(env.at("HIP_VISIBLE_DEVICES") == "5");
  // Off: LOCAL_RANK is the local rank and CUDA_VISIBLE_DEVICES is inherited untouched.
  c.virtual_local_rank = false;
  env = env_of(c, 1, 0, "e", {{"CUDA_VISIBLE_DEVICES", "4,6,7"}});
  CHECK(env.at("LOCAL_RANK") == "1");
  CHECK(env.at("CUDA_VISIBLE_DEVICES") == "4,6,7");
}

TEST_CASE("worker_specs: --log_line_prefix_template replaces the [rankN]: prefix", "[worker_specs]") {
  LaunchConfig config = launch_config_with(2);
  config.role = "trainer";
  config.hostname = "node7";
  CHECK(make_worker_specs(worker_settings(config), single_node_layout(2), train(), 0, {"d", false}, {})[1]
            .output.prefix == "[rank1]: ");
  config.log_line_prefix_template = "${hostname}:${rank}:$local_rank:${role_name}| ";
  const std::vector<WorkerSpec> specs =
      make_worker_specs(worker_settings(config), single_node_layout(2), train(), 0, {"d", false}, {});
  CHECK(specs[1].output.prefix == "node7:1:1:trainer| ");
}
