// Reading and checking the job secret; see job_secret.h.
#include "rendezvous/job_secret.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "command_line/launch_config.h"

namespace cpprun::launcher {
namespace {

// Shorter secrets could be guessed offline from one recorded handshake.
constexpr std::size_t kMinJobSecretBytes = 16;

const char* const kHowToMakeOne =
    "give every node the same secret of at least 16 characters, e.g. `export CPPRUN_JOB_SECRET=$(openssl rand "
    "-hex 32)` before starting cpprun on each node, or --job_secret_file=PATH naming a file that holds it";

std::string read_secret_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw UsageError("--job_secret_file=" + path + ": cannot read it (" + std::strerror(errno) +
                     "); give a file that holds the job's secret, readable by the user running cpprun");
  }
  std::ostringstream text;
  text << in.rdbuf();
  // A file written by `echo` or an editor ends in a newline that is not part of the secret.
  std::string secret = text.str();
  return secret.erase(secret.find_last_not_of(" \t\r\n") + 1);
}

}  // namespace

std::string resolve_job_secret(const JobSecretOptions& options, const EnvLookup& env) {
  const std::optional<std::string> from_env = env(kJobSecretVariable);
  if (options.no_job_secret) {
    if (!options.secret_file.empty()) {
      throw UsageError("--no_job_secret and --job_secret_file contradict each other; give one");
    }
    return {};
  }
  if (!options.multi_node) return {};  // no agent listens; workers never see the secret
  std::string secret;
  std::string source;
  if (!options.secret_file.empty()) {
    secret = read_secret_file(options.secret_file);
    source = "--job_secret_file=" + options.secret_file;
  } else if (from_env && !from_env->empty()) {
    secret = *from_env;
    source = kJobSecretVariable;
  } else {
    throw UsageError(
        "a multi-node job needs a job secret, so that only its own agents can join it or steer it: " +
        std::string(kHowToMakeOne) +
        ". To run without one, pass --no_job_secret (then anyone who can reach the rendezvous port can take a "
        "node's place, stop the job or choose its exit code)");
  }
  if (secret.size() < kMinJobSecretBytes) {
    throw UsageError(source + " holds a secret of " + std::to_string(secret.size()) +
                     " characters; it needs at least " + std::to_string(kMinJobSecretBytes) + ": " + kHowToMakeOne);
  }
  return secret;
}

std::string no_secret_warning(const std::string& endpoint) {
  return "cpprun: warning: --no_job_secret: the agents do not authenticate each other; anyone who can reach " +
         endpoint + " or this agent's link port can join the job in a node's place, stop it, or choose its exit "
         "code. Set CPPRUN_JOB_SECRET on every node to prevent that.";
}

}  // namespace cpprun::launcher
