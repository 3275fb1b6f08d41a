// read_dist_env(): the three launchers' conventions, and a clear error for each bad input.
#include "catch.h"
#include <c10/util/Exception.h>

#include <map>

#include "cpprun/env.h"

using cpprun::DistEnv;
using cpprun::EnvSource;
using Vars = std::map<std::string, std::string>;

namespace {

cpprun::EnvLookup lookup_in(const Vars& vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

DistEnv read(const Vars& vars) { return cpprun::read_dist_env(lookup_in(vars)); }

const Vars kTorchrun = {{"RANK", "3"},        {"WORLD_SIZE", "8"},        {"LOCAL_RANK", "1"},
                        {"LOCAL_WORLD_SIZE", "2"}, {"MASTER_ADDR", "10.1.2.3"}, {"MASTER_PORT", "29500"}};

Vars with(Vars vars, const std::string& name, const std::string& value) {
  vars[name] = value;
  return vars;
}
Vars without(Vars vars, const std::string& name) {
  vars.erase(name);
  return vars;
}

}  // namespace

TEST_CASE("env: torchrun variables are read", "[env]") {
  DistEnv env = read(kTorchrun);
  CHECK(env.source == EnvSource::kTorchrun);
  CHECK(env.rank == 3);
  CHECK(env.world_size == 8);
  CHECK(env.local_rank == 1);
  CHECK(env.local_world_size == 2);
  CHECK(env.master_addr == "10.1.2.3");
  CHECK(env.master_port == 29500);
  CHECK_FALSE(env.agent_hosts_store);
  CHECK(read(with(kTorchrun, "TORCHELASTIC_USE_AGENT_STORE", "True")).agent_hosts_store);
  CHECK(env.restart_count == 0);
  CHECK(read(with(kTorchrun, "TORCHELASTIC_RESTART_COUNT", "2")).restart_count == 2);
  CHECK_THROWS(read(with(kTorchrun, "TORCHELASTIC_RESTART_COUNT", "-1")));
}

TEST_CASE("env: without LOCAL_RANK a hand-started worker is taken as single-node", "[env]") {
  DistEnv env = read(without(without(kTorchrun, "LOCAL_RANK"), "LOCAL_WORLD_SIZE"));
  CHECK(env.local_rank == 3);
  CHECK(env.local_world_size == 8);
}

TEST_CASE("env: Slurm variables are read when RANK is absent", "[env]") {
  Vars slurm = {{"SLURM_PROCID", "5"},          {"SLURM_NTASKS", "8"},
                {"SLURM_LOCALID", "1"},         {"SLURM_TASKS_PER_NODE", "4(x2)"},
                {"MASTER_ADDR", "node001"},     {"MASTER_PORT", "1234"}};
  DistEnv env = read(slurm);
  CHECK(env.source == EnvSource::kSlurm);
  CHECK(env.rank == 5);
  CHECK(env.world_size == 8);
  CHECK(env.local_rank == 1);
  CHECK(env.local_world_size == 4);
  CHECK(read(with(slurm, "SLURM_NTASKS_PER_NODE", "2")).local_world_size == 2);
  // Slurm does not set MASTER_ADDR: the error says how to.
  CHECK_THROWS_WITH(read(without(slurm, "MASTER_ADDR")),
                    Catch::Contains("MASTER_ADDR is not set") && Catch::Contains("scontrol show hostnames"));
  // ... and does not say that srun sets it (it said "(it is set by srun for each task)").
  CHECK_THROWS_WITH(read(without(slurm, "MASTER_ADDR")), !Catch::Contains("set by srun"));
}

TEST_CASE("env: Open MPI variables are read when RANK and SLURM_PROCID are absent", "[env]") {
  Vars ompi = {{"OMPI_COMM_WORLD_RANK", "2"},       {"OMPI_COMM_WORLD_SIZE", "4"},
               {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
               {"MASTER_ADDR", "127.0.0.1"},        {"MASTER_PORT", "29501"}};
  DistEnv env = read(ompi);
  CHECK(env.source == EnvSource::kOpenMpi);
  CHECK(env.rank == 2);
  CHECK(env.world_size == 4);
  CHECK(env.local_rank == 0);
  CHECK(env.local_world_size == 2);
}

TEST_CASE("env: nothing set means a single process", "[env]") {
  DistEnv env = read({});
  CHECK(env.source == EnvSource::kSingleProcess);
  CHECK(env.rank == 0);
  CHECK(env.world_size == 1);
}

TEST_CASE("env: each bad input names the variable, its value and what sets it", "[env]") {
  CHECK_THROWS_WITH(read(without(kTorchrun, "WORLD_SIZE")),
                    Catch::Contains("WORLD_SIZE is not set") && Catch::Contains("cpprun or torchrun"));
  CHECK_THROWS_WITH(read(with(kTorchrun, "RANK", "abc")),
                    Catch::Contains("RANK=\"abc\" is not a whole number"));
  CHECK_THROWS_WITH(read(with(kTorchrun, "RANK", "3x")), Catch::Contains("RANK=\"3x\""));
  CHECK_THROWS_WITH(read(with(kTorchrun, "RANK", "-1")), Catch::Contains("RANK=-1 must be at least 0"));
  CHECK_THROWS_WITH(read(with(kTorchrun, "RANK", "8")),
                    Catch::Contains("RANK=8 is not below WORLD_SIZE=8"));
  CHECK_THROWS_WITH(read(with(kTorchrun, "WORLD_SIZE", "0")),
                    Catch::Contains("WORLD_SIZE=0 must be at least 1"));
  CHECK_THROWS_WITH(read(with(kTorchrun, "LOCAL_RANK", "2")),
                    Catch::Contains("LOCAL_RANK=2 is not below the local world size 2"));
  CHECK_THROWS_WITH(read(without(kTorchrun, "MASTER_ADDR")), Catch::Contains("MASTER_ADDR is not set"));
  CHECK_THROWS_WITH(read(without(kTorchrun, "MASTER_PORT")), Catch::Contains("MASTER_PORT is not set"));
  CHECK_THROWS_WITH(read(with(kTorchrun, "MASTER_PORT", "70000")),
                    Catch::Contains("MASTER_PORT=70000 is not a TCP port"));
  CHECK_THROWS_WITH(read(with(kTorchrun, "MASTER_PORT", "")), Catch::Contains("MASTER_PORT is not set"));
  CHECK_THROWS_WITH(read({{"SLURM_PROCID", "0"}}), Catch::Contains("SLURM_NTASKS is not set") &&
                                                       Catch::Contains("srun"));
}

TEST_CASE("env: TORCH_DISTRIBUTED_DEBUG is read as PyTorch reads it", "[env]") {
  using cpprun::DebugLevel;
  auto level = [](const Vars& vars) { return cpprun::read_debug_level(lookup_in(vars)); };
  CHECK(level({}) == DebugLevel::kOff);
  CHECK(level({{"TORCH_DISTRIBUTED_DEBUG", "OFF"}}) == DebugLevel::kOff);
  CHECK(level({{"TORCH_DISTRIBUTED_DEBUG", "info"}}) == DebugLevel::kInfo);
  CHECK(level({{"TORCH_DISTRIBUTED_DEBUG", "Detail"}}) == DebugLevel::kDetail);
  CHECK_THROWS_WITH(level({{"TORCH_DISTRIBUTED_DEBUG", "verbose"}}),
                    Catch::Contains("TORCH_DISTRIBUTED_DEBUG=\"verbose\"") &&
                        Catch::Contains("OFF, INFO or DETAIL"));
}
