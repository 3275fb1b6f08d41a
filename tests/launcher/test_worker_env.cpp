// Unit tests of the worker environment: torchrun's variables, rank arithmetic, user overrides.
#include <catch2/catch.hpp>

#include "rendezvous/rank_layout.h"
#include "workers/worker_specs.h"

using namespace cpprun::launcher;

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

}  // namespace

TEST_CASE("worker_env: sets every torchrun variable", "[worker_env]") {
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
      {"TORCHELASTIC_USE_AGENT_STORE", "False"},
      {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"},
      {"OMP_NUM_THREADS", "8"},
  };
  for (const auto& [name, value] : expected_subset) {
    INFO(name);
    REQUIRE(env.count(name) == 1);
    CHECK(env.at(name) == value);
  }
  // torchrun 2.x sets only the TORCH_ name; LibTorch warns in every NCCL worker about the old one.
  CHECK(env.count("NCCL_ASYNC_ERROR_HANDLING") == 0);
}

TEST_CASE("worker_env: multi-node ranks come from the rendezvous's layout", "[worker_env]") {
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
  // Node 0's agent hosts the store; worker rank 0 must connect to it, not host its own.
  CHECK(env.at("TORCHELASTIC_USE_AGENT_STORE") == "True");
}

TEST_CASE("worker_env: c10d workers get the endpoint's host and the rendezvous's MASTER_PORT", "[worker_env]") {
  WorkerEnvSettings c = config_with(1);
  c.master_addr = "node0";  // --rdzv_endpoint=node0:29400
  c.master_port = 29400;
  c.run_id = "job42";
  RankLayout layout = multi_node_layout({{2, "default"}, {1, "default"}}, 1);
  layout.agent_store = false;
  layout.master_port = 41234;
  const EnvMap env = make_worker_env(c, layout, 0, 0, "/run/e.json", {});
  CHECK(env.at("RANK") == "2");
  CHECK(env.at("MASTER_ADDR") == "node0");
  CHECK(env.at("MASTER_PORT") == "41234");
  CHECK(env.at("TORCHELASTIC_RUN_ID") == "job42");
  // As torchrun's c10d backend: worker rank 0 hosts the workers' store.
  CHECK(env.at("TORCHELASTIC_USE_AGENT_STORE") == "False");
}

TEST_CASE("worker_env: inherits the launcher's environment, launcher variables winning", "[worker_env]") {
  const EnvMap env = env_of(config_with(1), 0, 0, "/run/e.json", {{"PATH", "/x"}, {"RANK", "99"}});
  CHECK(env.at("PATH") == "/x");
  CHECK(env.at("RANK") == "0");
}

TEST_CASE("worker_env: workers do not inherit the job secret", "[worker_env]") {
  const EnvMap env =
      env_of(config_with(1), 0, 0, "/run/e.json", {{"CPPRUN_JOB_SECRET", "s3cret-s3cret-s3cret"}, {"HOME", "/h"}});
  CHECK(env.count("CPPRUN_JOB_SECRET") == 0);
  CHECK(env.at("HOME") == "/h");
}

TEST_CASE("worker_env: the user's NCCL error-handling values win", "[worker_env]") {
  const EnvMap env = env_of(config_with(2), 0, 0, "/run/e.json",
                                     {{"TORCH_NCCL_ASYNC_ERROR_HANDLING", "3"}, {"NCCL_ASYNC_ERROR_HANDLING", "0"}});
  CHECK(env.at("TORCH_NCCL_ASYNC_ERROR_HANDLING") == "3");
  CHECK(env.at("NCCL_ASYNC_ERROR_HANDLING") == "0");
  // The old name alone: LibTorch would read a TORCH_ value first, so none is added over it.
  const EnvMap old_only = env_of(config_with(2), 0, 0, "/run/e.json", {{"NCCL_ASYNC_ERROR_HANDLING", "0"}});
  CHECK(old_only.at("NCCL_ASYNC_ERROR_HANDLING") == "0");
  CHECK(old_only.count("TORCH_NCCL_ASYNC_ERROR_HANDLING") == 0);
}

TEST_CASE("worker_env: OMP_NUM_THREADS=1 only when unset and several workers share the node",
          "[worker_env]") {
  CHECK(defaults_omp_threads(2, {}));
  CHECK(env_of(config_with(2), 0, 0, "/run/e.json", {}).at("OMP_NUM_THREADS") == "1");

  CHECK_FALSE(defaults_omp_threads(1, {}));
  CHECK(env_of(config_with(1), 0, 0, "/run/e.json", {}).count("OMP_NUM_THREADS") == 0);

  // Set, even to the empty string, means the user chose.
  CHECK_FALSE(defaults_omp_threads(2, {{"OMP_NUM_THREADS", ""}}));
  CHECK(env_of(config_with(2), 0, 0, "/run/e.json", {{"OMP_NUM_THREADS", "4"}}).at("OMP_NUM_THREADS") ==
        "4");
}

TEST_CASE("worker_env: TORCHELASTIC_ERROR_FILE is the launcher's path, whatever the user set",
          "[worker_env]") {
  const EnvMap env = env_of(config_with(2), 1, 0, "/run/attempt_0/1/error.json",
                                     {{"TORCHELASTIC_ERROR_FILE", "/elsewhere"}});
  CHECK(env.at("TORCHELASTIC_ERROR_FILE") == "/run/attempt_0/1/error.json");
}

TEST_CASE("worker_env: execve strings are NAME=value", "[worker_env]") {
  CHECK(to_env_strings({{"A", "1"}, {"B", "x=y"}}) == std::vector<std::string>{"A=1", "B=x=y"});
}
