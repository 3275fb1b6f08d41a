// Unit tests of the scheduler defaults: Slurm, Open MPI and Kubeflow environments, faked.
#include "catch.h"

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "command_line/launch_config.h"
#include "command_line/scheduler_env.h"
#include "usage_error_text.h"

using namespace cpprun::launcher;
using Catch::Matchers::Contains;

namespace {

using Env = std::map<std::string, std::string>;

EnvLookup fake_env(Env vars) {
  return [vars = std::move(vars)](const std::string& name) -> std::optional<std::string> {
    const auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

Env slurm(const std::string& nnodes, const std::string& nodeid, const std::string& nodelist) {
  return {{"SLURM_JOB_ID", "123"}, {"SLURM_NNODES", nnodes}, {"SLURM_NODEID", nodeid},
          {"SLURM_JOB_NODELIST", nodelist}};
}

std::string scheduler_error(const Env& env) {
  try {
    derive_from_scheduler(fake_env(env));
  } catch (const SchedulerEnvError& e) {
    return e.what();
  }
  FAIL("expected a SchedulerEnvError");
  return {};
}

HostFacts fake_host() {
  HostFacts host;
  host.cpu_count = 8;
  host.pick_free_port = [] { return 45678; };
  host.random_run_id = [] { return std::string("random-run-id"); };
  return host;
}

// The scheduler's variables plus the job secret every multi-node launch needs (job_secret.h).
EnvLookup job_env(Env vars) {
  vars.emplace("CPPRUN_JOB_SECRET", "0123456789abcdef0123");
  return fake_env(std::move(vars));
}

ParsedCommandLine parse(const std::vector<std::string>& args, const Env& env) {
  ParsedCommandLine cli = parse_launch_config(args, fake_host(), job_env(env));
  REQUIRE(cli.outcome == CliOutcome::kLaunch);
  return cli;
}

std::string usage_error(const std::vector<std::string>& args, const Env& env) {
  return usage_error_text([&] { parse_launch_config(args, fake_host(), job_env(env)); });
}

}  // namespace

TEST_CASE("Slurm host lists: the first host, zero padding kept", "[scheduler_env]") {
  CHECK(first_slurm_host("n1") == "n1");
  CHECK(first_slurm_host("node[01-03]") == "node01");
  CHECK(first_slurm_host("node[7,9-10],gpu1") == "node7");
  CHECK(first_slurm_host("a-b[001-002]") == "a-b001");
  CHECK(first_slurm_host("node[01-03,07],gpu5") == "node01");
  CHECK(first_slurm_host("gpu5,node[01-03]") == "gpu5");
  CHECK(first_slurm_host("rack[1-2]-n[08-09]") == "rack1-n08");
  CHECK(first_slurm_host("10.0.0.[5-6]") == "10.0.0.5");
}

TEST_CASE("Malformed Slurm host lists name the variable and value", "[scheduler_env]") {
  for (const std::string bad : {"", "node[01-03", "node]01[", "node[]", "node[a-b]", ",n1"}) {
    CAPTURE(bad);
    REQUIRE_THROWS_AS(first_slurm_host(bad), SchedulerEnvError);
    REQUIRE_THROWS_WITH(first_slurm_host(bad), Contains("SLURM_JOB_NODELIST="));
  }
  CHECK_THROWS_WITH(first_slurm_host("node[01-03"), Contains("node[01-03") && Contains("--master_addr"));
}

TEST_CASE("No scheduler: no defaults", "[scheduler_env]") {
  CHECK_FALSE(derive_from_scheduler(fake_env({})).has_value());
  CHECK_FALSE(derive_from_scheduler(fake_env({{"MASTER_ADDR", "x"}, {"RANK", "0"}})).has_value());
  // A torchrun/cpprun worker's own variables are not a Kubeflow pod's.
  CHECK_FALSE(derive_from_scheduler(fake_env({{"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"},
                                              {"WORLD_SIZE", "4"}, {"RANK", "3"}, {"LOCAL_RANK", "1"}}))
                  .has_value());
}

TEST_CASE("Slurm: nnodes, node rank and the first host of the job", "[scheduler_env]") {
  const auto d = derive_from_scheduler(fake_env(slurm("4", "2", "node[7,9-10],gpu1")));
  REQUIRE(d.has_value());
  CHECK(d->source == "Slurm");
  CHECK(d->nnodes == 4);
  CHECK(d->node_rank == 2);
  CHECK(d->master_addr == std::optional<std::string>("node7"));
  CHECK_FALSE(d->master_port.has_value());
}

TEST_CASE("Slurm: invalid values are errors naming the variable", "[scheduler_env]") {
  CHECK_THAT(scheduler_error(slurm("two", "0", "n1")), Contains("SLURM_NNODES=two"));
  CHECK_THAT(scheduler_error(slurm("2", "2", "n[1-2]")), Contains("SLURM_NODEID=2"));
  CHECK_THAT(scheduler_error(slurm("2", "-1", "n[1-2]")), Contains("SLURM_NODEID=-1"));
  CHECK_THAT(scheduler_error(slurm("2", "0", "n[1-2")), Contains("SLURM_JOB_NODELIST=n[1-2"));
  Env many_tasks = slurm("2", "0", "n[1-2]");
  many_tasks["SLURM_STEP_NUM_TASKS"] = "8";
  CHECK_THAT(scheduler_error(many_tasks), Contains("SLURM_STEP_NUM_TASKS=8") && Contains("--ntasks-per-node=1"));
}

TEST_CASE("Open MPI: size and rank, address from MASTER_ADDR", "[scheduler_env]") {
  auto d = derive_from_scheduler(fake_env({{"OMPI_COMM_WORLD_SIZE", "3"}, {"OMPI_COMM_WORLD_RANK", "1"}}));
  REQUIRE(d.has_value());
  CHECK(d->source == "Open MPI");
  CHECK(d->nnodes == 3);
  CHECK(d->node_rank == 1);
  CHECK_FALSE(d->master_addr.has_value());
  d = derive_from_scheduler(fake_env({{"OMPI_COMM_WORLD_SIZE", "3"}, {"OMPI_COMM_WORLD_RANK", "0"},
                                      {"MASTER_ADDR", "head"}, {"MASTER_PORT", "1234"}}));
  REQUIRE(d.has_value());
  CHECK(d->master_addr == std::optional<std::string>("head"));
  CHECK(d->master_port == std::optional<int>(1234));
  CHECK_THAT(scheduler_error({{"OMPI_COMM_WORLD_SIZE", "3"}, {"OMPI_COMM_WORLD_RANK", "3"}}),
             Contains("OMPI_COMM_WORLD_RANK=3"));
  CHECK_THAT(scheduler_error({{"OMPI_COMM_WORLD_SIZE", "8"}, {"OMPI_COMM_WORLD_RANK", "0"},
                              {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}}),
             Contains("OMPI_COMM_WORLD_LOCAL_SIZE=4") && Contains("ppr:1:node"));
}

TEST_CASE("Kubeflow: WORLD_SIZE pods, RANK, MASTER_ADDR:MASTER_PORT", "[scheduler_env]") {
  const Env pod{{"MASTER_ADDR", "job-master-0"}, {"MASTER_PORT", "23456"}, {"WORLD_SIZE", "3"}, {"RANK", "2"}};
  const auto d = derive_from_scheduler(fake_env(pod));
  REQUIRE(d.has_value());
  CHECK(d->source == "Kubeflow");
  CHECK(d->nnodes == 3);
  CHECK(d->node_rank == 2);
  CHECK(d->master_addr == std::optional<std::string>("job-master-0"));
  CHECK(d->master_port == std::optional<int>(23456));
  Env bad_port = pod;
  bad_port["MASTER_PORT"] = "99999";
  CHECK_THAT(scheduler_error(bad_port), Contains("MASTER_PORT=99999"));
}

TEST_CASE("The command line takes the scheduler's values for what it does not give", "[scheduler_env]") {
  const ParsedCommandLine cli = parse({"./train"}, slurm("4", "2", "node[01-04]"));
  CHECK(cli.config.nnodes == 4);
  CHECK(cli.config.node_rank == 2);
  CHECK(cli.config.master_addr == "node01");
  CHECK(cli.config.master_port == 29500);
  CHECK(cli.scheduler_note == "cpprun: from Slurm: --nnodes=4 --node_rank=2 --master_addr=node01");

  const ParsedCommandLine pod = parse({"./train"}, {{"MASTER_ADDR", "m0"}, {"MASTER_PORT", "23456"},
                                                    {"WORLD_SIZE", "2"}, {"RANK", "1"}});
  CHECK(pod.config.master_addr == "m0");
  CHECK(pod.config.master_port == 23456);
  CHECK(pod.scheduler_note == "cpprun: from Kubeflow: --nnodes=2 --node_rank=1 --master_addr=m0 --master_port=23456");
}

TEST_CASE("Explicit flags win over the scheduler", "[scheduler_env]") {
  ParsedCommandLine cli = parse({"--master_addr=10.0.0.1", "--master_port=1234", "./train"}, slurm("4", "2", "n[1-4]"));
  CHECK(cli.config.nnodes == 4);
  CHECK(cli.config.master_addr == "10.0.0.1");
  CHECK(cli.config.master_port == 1234);
  CHECK(cli.scheduler_note == "cpprun: from Slurm: --nnodes=4 --node_rank=2");

  cli = parse({"--nnodes=1", "./train"}, slurm("4", "2", "n[1-4]"));  // one node: nothing taken
  CHECK(cli.config.nnodes == 1);
  CHECK(cli.config.master_addr == "127.0.0.1");
  CHECK(cli.scheduler_note.empty());

  cli = parse({"--nnodes=2", "--node_rank=0", "--rdzv_endpoint=h:5", "./train"}, slurm("4", "2", "n[1-4"));
  CHECK(cli.config.master_addr == "h");
  CHECK(cli.scheduler_note.empty());  // everything given: the broken host list is not even read

  cli = parse({"--standalone", "./train"}, slurm("4", "2", "n[1-4]"));
  CHECK(cli.config.nnodes == 1);
  CHECK(cli.scheduler_note.empty());

  cli = parse({"./train"}, slurm("1", "0", "n1"));  // a one-node job keeps the single-node defaults
  CHECK(cli.config.master_addr == "127.0.0.1");
  CHECK(cli.scheduler_note.empty());

  // c10d meets at --rdzv_endpoint and numbers the nodes itself: the scheduler is not consulted.
  cli = parse({"--rdzv_backend=c10d", "--rdzv_endpoint=h:5", "./train"}, slurm("4", "2", "n[1-4"));
  CHECK(cli.config.min_nodes == 1);
  CHECK(cli.config.master_addr == "h");
  CHECK(cli.scheduler_note.empty());
}

TEST_CASE("Scheduler values that do not fit are usage errors", "[scheduler_env]") {
  CHECK_THAT(usage_error({"./train"}, slurm("4", "x", "n[1-4]")), Contains("SLURM_NODEID=x"));
  CHECK_THAT(usage_error({"--nnodes=2", "./train"}, slurm("4", "3", "n[1-4]")),
             Contains("SLURM_NODEID=3") && Contains("--nnodes=2"));
  CHECK_THAT(usage_error({"./train"}, {{"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_RANK", "1"}}),
             Contains("Open MPI") && Contains("MASTER_ADDR") && Contains("--master_addr"));
  const ParsedCommandLine cli =
      parse({"--master_addr=head", "./train"}, {{"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_RANK", "1"}});
  CHECK(cli.config.nnodes == 2);
  CHECK(cli.config.node_rank == 1);
  CHECK(cli.config.master_addr == "head");
}
