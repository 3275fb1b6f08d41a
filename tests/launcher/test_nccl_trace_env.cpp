// Unit tests of where PyTorch's NCCL flight recorder is told to dump: the attempt's dir, unless the
// user chose a place; and nothing else in a worker's environment changes because of it.
#include "catch.h"

#include <string>

#include "workers/nccl_trace_env.h"
#include "workers/rank_layout.h"
#include "workers/worker_specs.h"

using namespace cpprun::launcher;

namespace {

EnvMap env_of_rank_1(const EnvMap& parent) {
  WorkerSettings settings;
  settings.env.local_world_size = 2;
  const ProgramCommand program{"/abs/train", {"./train"}, ""};
  const std::vector<WorkerSpec> specs =
      make_worker_specs(settings, single_node_layout(2), program, 3, {"/run", true}, parent);
  EnvMap env;
  for (const std::string& entry : specs.at(1).command.env) {
    const auto eq = entry.find('=');
    env[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  return env;
}

}  // namespace

TEST_CASE("nccl_trace_env: both prefix names point into the attempt's dir", "[nccl_trace_env]") {
  const auto set = nccl_trace_variables({{"PATH", "/bin"}}, "/run/attempt_0/nccl_flight_recorder");
  CHECK(set == std::map<std::string, std::string>{
                   {"TORCH_FR_DUMP_TEMP_FILE", "/run/attempt_0/nccl_flight_recorder/rank_"},
                   {"TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "/run/attempt_0/nccl_flight_recorder/rank_"}});
}

TEST_CASE("nccl_trace_env: the user's prefix, under either name, even empty, leaves both alone", "[nccl_trace_env]") {
  CHECK(nccl_trace_variables({{"TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "/mine/t_"}}, "/run/x").empty());
  CHECK(nccl_trace_variables({{"TORCH_FR_DUMP_TEMP_FILE", "/mine/t_"}}, "/run/x").empty());
  CHECK(nccl_trace_variables({{"TORCH_FR_DUMP_TEMP_FILE", ""}}, "/run/x").empty());
}

TEST_CASE("nccl_trace_env: dump-on-timeout and the buffer size are LibTorch's defaults or the user's",
          "[nccl_trace_env]") {
  // On by default in LibTorch (FlightRecorder.hpp); a user's "off" stays off, and cpprun adds no such variable.
  const auto set = nccl_trace_variables({{"TORCH_NCCL_DUMP_ON_TIMEOUT", "0"}, {"TORCH_NCCL_TRACE_BUFFER_SIZE", "0"}},
                                        "/run/x");
  CHECK(set.size() == 2);
  CHECK(set.count("TORCH_NCCL_DUMP_ON_TIMEOUT") == 0);
  CHECK(set.count("TORCH_FR_BUFFER_SIZE") == 0);
}

TEST_CASE("nccl_trace_env: a worker's environment differs by the two prefix names only", "[nccl_trace_env]") {
  const EnvMap parent{{"PATH", "/bin"}, {"HOME", "/home/u"}};
  EnvMap ours = env_of_rank_1(parent);
  EnvMap users = parent;
  users["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] = "/mine/t_";
  EnvMap theirs = env_of_rank_1(users);
  CHECK(ours.at("TORCH_FR_DUMP_TEMP_FILE") == "/run/attempt_3/nccl_flight_recorder/rank_");
  CHECK(ours.at("TORCH_NCCL_DEBUG_INFO_TEMP_FILE") == "/run/attempt_3/nccl_flight_recorder/rank_");
  CHECK(theirs.at("TORCH_NCCL_DEBUG_INFO_TEMP_FILE") == "/mine/t_");  // as the user set it
  CHECK(theirs.count("TORCH_FR_DUMP_TEMP_FILE") == 0);
  // Everything else is the same, variable for variable.
  ours.erase("TORCH_FR_DUMP_TEMP_FILE");
  ours.erase("TORCH_NCCL_DEBUG_INFO_TEMP_FILE");
  theirs.erase("TORCH_NCCL_DEBUG_INFO_TEMP_FILE");
  CHECK(ours == theirs);
}

TEST_CASE("nccl_trace_env: the spec carries the dir only when cpprun chose it", "[nccl_trace_env]") {
  WorkerSettings settings;
  const ProgramCommand program{"/abs/train", {"./train"}, ""};
  CHECK(make_worker_specs(settings, single_node_layout(1), program, 0, {"/tmp/c", false}, {})[0].nccl_trace_dir ==
        "/tmp/c/attempt_0.nccl_flight_recorder");
  CHECK(make_worker_specs(settings, single_node_layout(1), program, 0, {"/tmp/c", false},
                          {{"TORCH_FR_DUMP_TEMP_FILE", "/mine/t_"}})[0]
            .nccl_trace_dir.empty());
}
