// torchrun's worker environment (LocalElasticAgent._start_workers).
#include "workers/worker_env.h"

#include "rendezvous/job_secret.h"

extern char** environ;

namespace cpprun::launcher {

EnvMap current_environment() {
  EnvMap env;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    const std::string text = *entry;
    const auto eq = text.find('=');
    if (eq == std::string::npos) continue;  // not NAME=value; execve would pass it, nobody reads it
    env.emplace(text.substr(0, eq), text.substr(eq + 1));
  }
  return env;
}

bool defaults_omp_threads(int local_world_size, const EnvMap& parent) {
  return local_world_size > 1 && parent.count("OMP_NUM_THREADS") == 0;
}

EnvMap make_worker_env(const WorkerEnvSettings& settings, const RankLayout& layout, int local_rank, int restart_count,
                       const std::string& error_file, const EnvMap& parent) {
  EnvMap env = parent;
  // Only the agents need the job secret; a worker, or anything it runs, could leak it.
  env.erase(kJobSecretVariable);
  env["RANK"] = std::to_string(layout.base_rank + local_rank);
  env["LOCAL_RANK"] = std::to_string(local_rank);
  env["WORLD_SIZE"] = std::to_string(layout.world_size);
  env["LOCAL_WORLD_SIZE"] = std::to_string(settings.local_world_size);
  env["GROUP_RANK"] = std::to_string(layout.group_rank);
  env["GROUP_WORLD_SIZE"] = std::to_string(layout.group_world_size);
  env["ROLE_RANK"] = std::to_string(layout.role_base_rank + local_rank);
  env["ROLE_WORLD_SIZE"] = std::to_string(layout.role_world_size);
  env["ROLE_NAME"] = settings.role;
  env["MASTER_ADDR"] = settings.master_addr;
  env["MASTER_PORT"] = std::to_string(layout.master_port != 0 ? layout.master_port : settings.master_port);
  env["TORCHELASTIC_RESTART_COUNT"] = std::to_string(restart_count);
  env["TORCHELASTIC_MAX_RESTARTS"] = std::to_string(settings.max_restarts);
  env["TORCHELASTIC_RUN_ID"] = settings.run_id;
  // Per worker and per attempt, so the launcher knows whose it is; torchrun overrides the user's too.
  env["TORCHELASTIC_ERROR_FILE"] = error_file;
  // One node, or c10d: the launcher hosts no store, worker rank 0 creates the c10d TCPStore at
  // MASTER_ADDR:MASTER_PORT (torchrun's c10d backend picks that port on group rank 0's host, as
  // ours does). Several nodes of a static job: node 0's agent hosts it (see Note [Agent store]).
  // Python's spelling of the boolean, because that is what torch's code compares against.
  env["TORCHELASTIC_USE_AGENT_STORE"] = layout.agent_store ? "True" : "False";
  // Async error handling turns a hung collective into a failed worker we can restart; the user's
  // own setting wins, under either name (LibTorch reads the TORCH_ one first, so setting it would
  // override a user's old-style NCCL_ASYNC_ERROR_HANDLING). Only the TORCH_ name is ours, as in
  // torchrun 2.x: LibTorch warns in every NCCL worker about the old one (seen on the GPU machine).
  if (parent.count("TORCH_NCCL_ASYNC_ERROR_HANDLING") == 0 && parent.count("NCCL_ASYNC_ERROR_HANDLING") == 0) {
    env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "1";
  }
  if (defaults_omp_threads(settings.local_world_size, parent)) env["OMP_NUM_THREADS"] = "1";
  return env;
}

std::vector<std::string> to_env_strings(const EnvMap& env) {
  std::vector<std::string> strings;
  strings.reserve(env.size());
  for (const auto& [name, value] : env) strings.push_back(name + "=" + value);
  return strings;
}

}  // namespace cpprun::launcher
