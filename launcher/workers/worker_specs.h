// What one attempt starts: per local rank, the command, its environment and where its output goes;
// and --dry_run's report of it. Pure, so the dry run prints exactly what a real run would start.
#pragma once

#include <string>
#include <vector>

#include "command_line/program_command.h"
#include "rendezvous/rank_layout.h"
#include "workers/run_directory.h"
#include "workers/worker_env.h"
#include "workers/worker_group.h"

namespace cpprun::launcher {

// What the workers' specs take of the command line.
struct WorkerSettings {
  WorkerEnvSettings env;
  OutputOptions output;  // --redirects, --tee, --local_ranks_filter, --log_dir
};

// `ranks` places the node's workers in the job; `program` is what each runs (program_command.h);
// `files` says where each worker's files go (see RunDirectory); `restart_count` is the attempt.
std::vector<WorkerSpec> make_worker_specs(const WorkerSettings& settings, const RankLayout& ranks,
                                          const ProgramCommand& program, int restart_count, const RunLayout& files,
                                          const EnvMap& parent_env);

// `word` quoted for a POSIX shell when it needs it, so the printed commands can be pasted.
std::string shell_quote(const std::string& word);

// Each worker's command line, where its output goes, and the variables cpprun sets or changes.
std::string format_dry_run(const std::vector<WorkerSpec>& specs, const EnvMap& parent_env);

}  // namespace cpprun::launcher
