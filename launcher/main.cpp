// cpprun: torchrun's single-node launcher for C++ programs. Parses the options, then runs attempts
// (start the workers, wait, stop them) until one succeeds, a signal ends the job, or the restarts
// run out.
#include <cstdlib>
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include "failure_report.h"
#include "host_facts.h"
#include "launch_config.h"
#include "program_lookup.h"
#include "signal_relay.h"
#include "worker_env.h"
#include "worker_group.h"
#include "worker_process.h"

namespace {

using namespace cpprun::launcher;

std::vector<WorkerSpec> make_worker_specs(const LaunchConfig& config, const std::string& program_path,
                                          int restart_count, const EnvMap& parent_env) {
  std::vector<WorkerSpec> specs;
  for (int local_rank = 0; local_rank < config.nproc_per_node; ++local_rank) {
    WorkerSpec spec;
    spec.local_rank = local_rank;
    spec.rank = config.node_rank * config.nproc_per_node + local_rank;
    spec.command.path = program_path;
    spec.command.argv.push_back(config.program);
    spec.command.argv.insert(spec.command.argv.end(), config.program_args.begin(),
                             config.program_args.end());
    spec.command.env = to_env_strings(make_worker_env(config, local_rank, restart_count, parent_env));
    specs.push_back(std::move(spec));
  }
  return specs;
}

int run(const LaunchConfig& config) {
  const std::string program_path = resolve_program(config.program, std::getenv("PATH"));
  const EnvMap parent_env = current_environment();
  if (defaults_omp_threads(config, parent_env)) {
    std::cerr << "cpprun: setting OMP_NUM_THREADS=1 for each of the " << config.nproc_per_node
              << " workers so they do not overload the CPU; set OMP_NUM_THREADS yourself to tune it\n";
  }
  SignalRelay relay;
  for (int restart = 0;; ++restart) {
    WorkerGroup group(relay);
    group.start(make_worker_specs(config, program_path, restart, parent_env), config.shutdown_timeout);
    const GroupOutcome outcome = group.wait();
    if (outcome.end == GroupEnd::kSucceeded) return 0;

    group.stop(outcome.end == GroupEnd::kInterrupted ? StopStart::kAlreadySignalled : StopStart::kSendSigterm,
               config.shutdown_timeout);
    std::cerr << format_attempt_summary(group.workers(),
                                        {outcome.root_cause, group.ending_signal(), config.shutdown_timeout});
    if (group.ending_signal() != 0) return 128 + group.ending_signal();

    const WorkerRecord& root = group.workers().at(outcome.root_cause.value());
    if (restart < config.max_restarts) {
      std::cerr << "cpprun: restarting all workers (restart " << restart + 1 << " of --max_restarts="
                << config.max_restarts << ", TORCHELASTIC_RESTART_COUNT=" << restart + 1 << ")\n";
      continue;
    }
    const int code = root.exit->launcher_exit_code();
    std::cerr << "cpprun: ";
    if (config.max_restarts > 0) {
      std::cerr << "giving up after " << restart + 1 << " attempts (--max_restarts=" << config.max_restarts
                << "); ";
    }
    std::cerr << "exiting with code " << code << " from " << describe_worker(root) << "\n";
    return code;
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const ParsedCommandLine cli = parse_launch_config({argv + 1, argv + argc}, probe_host());
    if (cli.outcome == CliOutcome::kShowHelp) {
      std::cout << cli.help_text;
      return 0;
    }
    return run(cli.config);
  } catch (const UsageError& e) {
    std::cerr << "cpprun: " << e.what() << "\n";
    return kUsageExitCode;
  } catch (const ProgramNotRunnable& e) {
    std::cerr << e.what() << "\n";
    return e.exit_code();
  } catch (const SpawnError& e) {
    std::cerr << e.what() << "\n";
    return e.exit_code();
  } catch (const std::exception& e) {
    // Workers were already stopped while unwinding (~WorkerGroup).
    std::cerr << "cpprun: internal error: " << e.what() << "\n";
    return 1;
  }
}
