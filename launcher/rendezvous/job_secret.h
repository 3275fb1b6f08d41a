// Where a multi-node job's secret comes from, and what makes it acceptable. The agents prove it to
// each other before anything one says is acted upon (Note [Agent authentication], link_auth.h).
#pragma once

#include <string>

#include "command_line/scheduler_env.h"

namespace cpprun::launcher {

// The environment variable that holds the secret, the same on every node.
inline constexpr const char* kJobSecretVariable = "CPPRUN_JOB_SECRET";

struct JobSecretOptions {
  bool multi_node = false;
  std::string secret_file;     // --job_secret_file: wins over the environment variable
  bool no_job_secret = false;  // --no_job_secret: the user accepts unauthenticated agents
};

// The job's secret: "" for a single-node job (no agent listens) or with --no_job_secret; else
// --job_secret_file's, or CPPRUN_JOB_SECRET through `env`. Throws UsageError (launch_config.h)
// when a multi-node job has none, or one too short, naming what to do.
std::string resolve_job_secret(const JobSecretOptions& options, const EnvLookup& env);

// What --no_job_secret exposes, printed when a multi-node agent starts without a secret.
std::string no_secret_warning(const std::string& endpoint);

}  // namespace cpprun::launcher
