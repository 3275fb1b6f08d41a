// What `cpprun [options] PROGRAM [ARGS...]` asked for, parsed and validated. Pure: no processes,
// no environment writes, so every rule here is unit-tested.
#pragma once

#include <chrono>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "command_line/host_facts.h"
#include "command_line/output_spec.h"
#include "command_line/program_command.h"
#include "command_line/scheduler_env.h"
#include "rendezvous/rendezvous_settings.h"
#include "workers/restart_backoff.h"
#include "workers/worker_specs.h"

namespace cpprun::launcher {

struct LaunchConfig {
  int nproc_per_node = 1;
  RendezvousBackend rdzv_backend = RendezvousBackend::kStatic;  // see rendezvous/rendezvous_settings.h
  int nnodes = 1;     // static: the number of nodes; c10d: max_nodes
  int min_nodes = 1;  // --nnodes=MIN:MAX; static: both are nnodes
  int max_nodes = 1;
  int node_rank = 0;  // static only; c10d ignores --node_rank, as torchrun does
  // static: node 0's address and port: its agent hosts the c10d store there when nnodes > 1, worker
  // rank 0 when nnodes == 1; --rdzv_endpoint, when given, sets them. c10d: --rdzv_endpoint (default
  // port 29400), where one agent hosts the rendezvous; the workers get this MASTER_ADDR and the
  // MASTER_PORT the rendezvous picks.
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // How long an agent waits for the rendezvous to complete (--rdzv_conf join_timeout=S).
  std::chrono::milliseconds join_timeout{600 * 1000};
  // c10d: once MIN nodes are there, how long to wait for more (--rdzv_conf last_call_timeout=S).
  std::chrono::milliseconds last_call_timeout{30 * 1000};
  // c10d: --rdzv_conf is_host=1/0 says whether this agent hosts the rendezvous; unset: the first
  // agent that can listen at the endpoint does.
  std::optional<bool> is_host;
  bool standalone = false;  // master_addr/master_port were replaced by 127.0.0.1 and a free port
  int max_restarts = 0;
  // --restart_backoff=INITIAL[:MAX]: the wait before each restart after a failure (restart_backoff.h).
  RestartBackoffSettings restart_backoff;
  // SIGTERM (or the forwarded signal) -> SIGKILL grace. torchrun waits 30 s inside its agent; the
  // launcher defaults to 5 s so a hung rank does not hold a failed job for half a minute.
  std::chrono::milliseconds shutdown_timeout{5000};
  std::string run_id = "none";
  std::string role = "default";
  // Accepted for torchrun command lines and ignored: the launcher waits on events, it does not
  // poll.
  double monitor_interval = 0.1;
  // --no_python, -m, --run_path, or none of them: see program_command.h.
  ProgramMode program_mode = ProgramMode::kByName;

  // Multi-node: what the agents prove to each other (job_secret.h); "" with --no_job_secret.
  std::string job_secret;
  bool no_job_secret = false;

  OutputOptions output;  // --redirects, --tee, --local_ranks_filter, --log_dir
  bool dry_run = false;  // print what would run, start nothing

  std::string program;                    // as typed; resolved when launching (program_command.h)
  std::vector<std::string> program_args;  // passed to PROGRAM untouched, flags included
};

enum class CliOutcome { kLaunch, kShowHelp };

struct ParsedCommandLine {
  CliOutcome outcome = CliOutcome::kLaunch;
  LaunchConfig config;    // valid when outcome == kLaunch
  std::string help_text;  // valid when outcome == kShowHelp; CLI11 writes it
  // "cpprun: from Slurm: --nnodes=4 --node_rank=2 --master_addr=node01" when options not given on
  // the command line (or as PET_<NAME>) came from the scheduler's environment; empty otherwise.
  std::string scheduler_note;
};

// A mistake on the command line. The message names the flag and its value and says how to fix
// it; the launcher prints it and exits with kUsageExitCode.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// argparse's (and so torchrun's) code for a bad command line.
inline constexpr int kUsageExitCode = 2;

// `args` is argv without argv[0]. --nnodes, --node_rank, --master_addr and --master_port that are
// neither on the command line nor in PET_<NAME> come from the scheduler's variables read through
// `env` (see scheduler_env.h), and scheduler_note says which. Throws UsageError.
ParsedCommandLine parse_launch_config(const std::vector<std::string>& args, const HostFacts& host,
                                      const EnvLookup& env);

// The same with the process environment; prints scheduler_note, if any, to stderr.
ParsedCommandLine parse_launch_config(const std::vector<std::string>& args, const HostFacts& host);

// The agent talks to other nodes' agents: static with nnodes > 1, or c10d (even 1:1, like torchrun).
bool is_multi_node(const LaunchConfig& config);

// --master_addr:--master_port, as endpoint_text(host, port) writes it.
std::string endpoint_text(const LaunchConfig& config);

// What each component takes of the command line.
RendezvousSettings rendezvous_settings(const LaunchConfig& config);
WorkerSettings worker_settings(const LaunchConfig& config);

}  // namespace cpprun::launcher
