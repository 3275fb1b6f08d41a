// Building each worker's command, environment and output plan.
#include "workers/worker_specs.h"

namespace cpprun::launcher {

std::vector<WorkerSpec> make_worker_specs(const WorkerSettings& settings, const RankLayout& ranks,
                                          const ProgramCommand& program, int restart_count, const RunLayout& files,
                                          const EnvMap& parent_env) {
  std::vector<WorkerSpec> specs;
  for (int local_rank = 0; local_rank < settings.env.local_world_size; ++local_rank) {
    WorkerSpec spec;
    spec.local_rank = local_rank;
    spec.rank = ranks.base_rank + local_rank;
    spec.command.path = program.path;
    spec.command.argv = program.argv;
    spec.error_file = files.error_file(restart_count, local_rank);
    spec.command.env =
        to_env_strings(make_worker_env(settings.env, ranks, local_rank, restart_count, spec.error_file, parent_env));
    // Without --log_dir nothing goes to files (the parser insists), so the flat temp dir is fine.
    spec.output =
        plan_worker_output(settings.output, local_rank, spec.rank, files.worker_dir(restart_count, local_rank));
    specs.push_back(std::move(spec));
  }
  return specs;
}

}  // namespace cpprun::launcher
