// The environment each worker starts with: the launcher's own, plus exactly the variables torchrun
// sets. Pure, so the rules are unit-tested.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "rendezvous/rank_layout.h"

namespace cpprun::launcher {

using EnvMap = std::map<std::string, std::string>;

// The torchrun variables that come from the command line, the same for every worker of the job.
struct WorkerEnvSettings {
  int local_world_size = 1;  // --nproc_per_node
  std::string role = "default";
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;  // unless the rendezvous picked one (RankLayout::master_port)
  int max_restarts = 0;
  std::string run_id = "none";
};

// This process's environment (`environ`), first definition winning like getenv().
EnvMap current_environment();

// torchrun sets OMP_NUM_THREADS=1 when several workers share a node and the user left it unset, so
// N workers do not each start one OpenMP thread per core. The launcher announces it once.
bool defaults_omp_threads(int local_world_size, const EnvMap& parent);

// `layout` places this node's workers in the job (single_node_layout, or the rendezvous's).
// `error_file` becomes TORCHELASTIC_ERROR_FILE: where torch's @record writes the worker's
// exception, which the failure summary then shows.
EnvMap make_worker_env(const WorkerEnvSettings& settings, const RankLayout& layout, int local_rank, int restart_count,
                       const std::string& error_file, const EnvMap& parent);

// "NAME=value" strings for execve.
std::vector<std::string> to_env_strings(const EnvMap& env);

}  // namespace cpprun::launcher
