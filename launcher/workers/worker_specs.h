// What one attempt starts: per local rank, the command, its environment (the launcher's own plus
// exactly the variables torchrun sets) and where its output goes; and --dry_run's report of it.
// Pure, so the rules are unit-tested and the dry run prints exactly what a real run would start.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "command_line/launch_config.h"
#include "command_line/program_command.h"
#include "common/formatting.h"  // shell_quote, which the tests of format_dry_run use
#include "workers/attempt.h"
#include "workers/rank_layout.h"
#include "workers/run_directory.h"

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
  // LOCAL_RANK=0 and one GPU each (torchrun's --virtual_local_rank); checked against the parent's
  // CUDA_VISIBLE_DEVICES by the parser.
  bool virtual_local_rank = false;
  std::string signals_to_handle = "SIGTERM,SIGINT,SIGHUP,SIGQUIT";  // TORCHELASTIC_SIGNALS_TO_HANDLE
  bool use_agent_store = true;  // TORCHELASTIC_USE_AGENT_STORE (LaunchConfig::agent_store)
};

// What the workers' specs take of the command line.
struct WorkerSettings {
  WorkerEnvSettings env;
  OutputOptions output;  // --redirects, --tee, --local_ranks_filter, --log_dir
  std::string log_line_prefix_template;  // "": "[rankN]: "
  std::string hostname;                  // its ${hostname}
  UninterruptibleStateSettings uninterruptible_state;  // TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT
};

// What the workers take of the command line.
WorkerSettings worker_settings(const LaunchConfig& config);

// This process's environment (`environ`), first definition winning like getenv().
EnvMap current_environment();

// torchrun sets OMP_NUM_THREADS=1 when several workers share a node and the user left it unset, so
// N workers do not each start one OpenMP thread per core. The launcher announces it once.
bool defaults_omp_threads(int local_world_size, const EnvMap& parent);

// `layout` places this node's workers in the job. `error_file` becomes TORCHELASTIC_ERROR_FILE,
// where torch's @record writes the worker's exception for the failure summary.
EnvMap make_worker_env(const WorkerEnvSettings& settings, const RankLayout& layout, int local_rank, int restart_count,
                       const std::string& error_file, const EnvMap& parent);

// The store keeper's environment (store_keeper.h): cpprun's own, less the job secret.
EnvMap make_keeper_env(const EnvMap& parent);

// "NAME=value" strings for execve.
std::vector<std::string> to_env_strings(const EnvMap& env);

// Note [torchrun's ${local_rank} in the program's arguments]
// torchrun's agent passes every argument after the program through Python's
// string.Template(arg).safe_substitute(local_rank=LOCAL_RANK) (torch.distributed.elastic.utils.api's
// macros), so `train.py --out=log_${local_rank}.txt` gives each worker its own file. cpprun does the
// same, to the same rules: `$local_rank` and `${local_rank}` become the local rank, and any other `$`
// text (`$HOME`, `${x`, a lone `$`) stays as it is. One deliberate difference: Template also makes
// `$$` one `$`, which breaks `sh -c 'echo $$ >pid'` (the shell's pid) under torchrun; cpprun leaves
// `$$` as it is (and `$$local_rank` too, which torchrun makes `$local_rank`). Pure.
std::string substitute_local_rank(const std::string& arg, int local_rank);

// `files` says where each worker's files go; `restart_count` is the attempt.
std::vector<WorkerSpec> make_worker_specs(const WorkerSettings& settings, const RankLayout& ranks,
                                          const ProgramCommand& program, int restart_count, const RunLayout& files,
                                          const EnvMap& parent_env);

// Each worker's command line, where its output goes, and the variables cpprun sets or changes.
std::string format_dry_run(const std::vector<WorkerSpec>& specs, const EnvMap& parent_env);

}  // namespace cpprun::launcher
