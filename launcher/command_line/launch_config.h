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
#include "command_line/rendezvous_settings.h"
#include "command_line/restart_backoff_settings.h"
#include "command_line/uninterruptible_state_settings.h"
#include "common/errors.h"  // UsageError, kUsageExitCode: thrown and returned for a bad command line
#include "cpprun/env_lookup.h"

namespace cpprun::launcher {

struct LaunchConfig {
  int nproc_per_node = 1;
  RendezvousBackend rdzv_backend = RendezvousBackend::kStatic;  // see command_line/rendezvous_settings.h
  int nnodes = 1;     // static: the number of nodes; c10d: max_nodes
  int min_nodes = 1;  // --nnodes=MIN:MAX; static: both are nnodes
  int max_nodes = 1;
  int node_rank = 0;  // static only; c10d ignores --node_rank, as torchrun does
  // static: node 0's c10d store (--master_addr/--master_port or --rdzv_endpoint). c10d: --rdzv_endpoint,
  // where one agent hosts the rendezvous; workers get the MASTER_PORT the rendezvous picks.
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // How errors name master_addr: "--master_addr=HOST", or "the host of --rdzv_endpoint=HOST:PORT" where
  // the endpoint gave it (static's endpoint, c10d, c10d's port 0 on one node); "" before validation.
  std::string master_addr_flag;
  // --rdzv_conf (Note [--rdzv_conf as torchrun's backends read it]): the join wait is static's `timeout`
  // (900 s by default, as torchrun's LaunchConfig sets it) or c10d's join_timeout (600 s);
  // last_call_timeout and is_host are c10d's (is_host unset: the first agent that listens hosts).
  std::chrono::milliseconds join_timeout{900 * 1000};
  std::chrono::milliseconds last_call_timeout{30 * 1000};
  std::optional<bool> is_host;
  bool standalone = false;  // master_addr/master_port were replaced by 127.0.0.1 and a free port
  // One node, no --master_port (nor --rdzv_endpoint): as torchrun 2.x, a free port and a random run id,
  // so two default jobs on one host do not collide. Also true with --standalone.
  bool picked_port = false;
  // TORCHELASTIC_USE_AGENT_STORE: the agent (its store keeper) hosts the workers' store. false only
  // for a job torchrun runs with its c10d handler on one node (picked_port) when
  // TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, PyTorch's opt-out (Note [Opting out of the agent's store]).
  bool agent_store = true;
  int max_restarts = 0;
  RestartBackoffSettings restart_backoff;
  // SIGTERM (or the forwarded signal) -> SIGKILL grace: --shutdown_timeout, else
  // $TORCH_ELASTIC_SHUTDOWN_TIMEOUT, else 5 s (torchrun: 30 s), so a hung rank does not hold a failed
  // job for half a minute.
  std::chrono::milliseconds shutdown_timeout{5000};
  std::string run_id = "none";
  std::string role = "default";
  double monitor_interval = 0.1;  // cpprun waits on events; it paces the D-state check alone
  // TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT (0: off) and --monitor_interval as its period.
  UninterruptibleStateSettings uninterruptible_state;
  ProgramMode program_mode = ProgramMode::kByName;

  // Multi-node: what the agents prove to each other (job_secret.h); "" with --no_job_secret.
  std::string job_secret;
  bool no_job_secret = false;
  // Where a secret the user did not give is kept, said once when the agent starts ("" otherwise).
  std::string job_secret_note;

  OutputOptions output;  // --redirects, --tee, --local_ranks_filter, --log_dir
  // --log_line_prefix_template (or $TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE): "" keeps "[rankN]: ".
  std::string log_line_prefix_template;
  std::string hostname;  // ${hostname} in that template
  bool virtual_local_rank = false;  // LOCAL_RANK=0, each worker sees only its GPU
  std::string signals_to_handle = "SIGTERM,SIGINT,SIGHUP,SIGQUIT";  // exported as torchrun does
  std::string local_addr;  // c10d: the hosting agent's address for the workers' MASTER_ADDR
  bool dry_run = false;  // print what would run, start nothing

  std::string program;                    // as typed; resolved when launching (program_command.h)
  std::vector<std::string> program_args;  // passed to PROGRAM untouched, flags included
};

enum class CliOutcome { kLaunch, kShowHelp };

struct ParsedCommandLine {
  CliOutcome outcome = CliOutcome::kLaunch;
  LaunchConfig config;    // valid when outcome == kLaunch
  std::string help_text;  // valid when outcome == kShowHelp; CLI11 writes it (or --print_completion's script)
  // "cpprun: from Slurm: --nnodes=4 --node_rank=2 --master_addr=node01" if the scheduler gave options.
  std::string scheduler_note;
  // "cpprun: --numa_binding=node is accepted and ignored: ..." for torchrun options cpprun cannot honour.
  std::vector<std::string> notes;
};

// A bound on --nnodes and on the schedulers' node counts.
inline constexpr int kMaxNodes = 1 << 16;

// `args` is argv without argv[0]. --nnodes, --node_rank, --master_addr and --master_port not given
// (nor as PET_<NAME>) come from the scheduler's variables in `env` (scheduler_env.h). Throws UsageError.
ParsedCommandLine parse_launch_config(const std::vector<std::string>& args, const HostFacts& host,
                                      const EnvLookup& env = process_env());

// The agent talks to other nodes' agents: static with nnodes > 1, or c10d (even 1:1, like torchrun).
bool is_multi_node(const LaunchConfig& config);

// --master_addr:--master_port, as endpoint_text(host, port) writes it.
std::string endpoint_text(const LaunchConfig& config);

// What the rendezvous takes of the command line (the workers' part: worker_settings(), worker_specs.h).
RendezvousSettings rendezvous_settings(const LaunchConfig& config);

// How errors quote an option or a scheduler variable: "--master_port=http", "--master_addr=''".
std::string with_value(const std::string& name, const std::string& value);

// `text` if it is a whole number from min to max as Python's int() reads it, which torchrun's
// type=int options and its own int() calls use: "4", "-1", " 4 ", "+4", "1_000"; not "4x", "4.0",
// "4 4", "_4" or "".
std::optional<int> int_in_range(const std::string& text, long min, long max);

}  // namespace cpprun::launcher
