// --dry_run's report: each worker's command line, where its output would go, and the environment
// variables cpprun sets or changes for it. Pure, so unit-tested.
#pragma once

#include <string>
#include <vector>

#include "workers/worker_env.h"
#include "workers/worker_group.h"

namespace cpprun::launcher {

// `word` quoted for a POSIX shell when it needs it, so the printed commands can be pasted.
std::string shell_quote(const std::string& word);

std::string format_dry_run(const std::vector<WorkerSpec>& specs, const EnvMap& parent_env);

}  // namespace cpprun::launcher
