// cpprun: torchrun's launcher for C++ programs. Parses the options, then runs attempts (start the
// workers, wait, stop them) until one succeeds, a signal ends the job, or the restarts run out;
// with --nnodes > 1 or --rdzv_backend=c10d, in step with the other nodes' agents (node_rendezvous.h).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include "command_line/host_facts.h"
#include "command_line/launch_config.h"
#include "command_line/program_command.h"
#include "rendezvous/node_rendezvous.h"
#include "rendezvous/store_tunnel_io.h"  // loopback_family_for
#include "workers/attempt.h"
#include "workers/console_sink.h"
#include "workers/diagnose_request.h"
#include "workers/error_file.h"
#include "workers/file_timer.h"
#include "workers/flight_requests.h"
#include "workers/job_process_tree.h"
#include "workers/open_file_limit.h"
#include "workers/rank_layout.h"
#include "workers/restart_backoff.h"
#include "workers/run_directory.h"
#include "workers/signal_relay.h"
#include "workers/store_keeper.h"
#include "workers/worker_process.h"
#include "workers/worker_specs.h"

namespace {

using namespace cpprun::launcher;

// Started with fd 0, 1 or 2 closed, the next pipe() would return it and a worker's output pipe
// could land on the very descriptor it is dup2()ed to. /dev/null fills the gap.
void ensure_standard_fds() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (fcntl(fd, F_GETFD) < 0 && open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY) < 0) std::_Exit(1);
  }
}

// The launcher's own failure: on stderr, and in its TORCHELASTIC_ERROR_FILE as torchrun's @record
// puts it (Note [The launcher's own failure in its error file]).
int report(const std::exception& error, int exit_code) {
  std::cerr << error.what() << "\n";
  record_launcher_error(error.what());
  return exit_code;
}

// The keeper of the workers' store (Note [Store keeper] in store_keeper_plan.h): chosen before anything
// starts, so that a missing one is one clear error.
KeeperChoice find_store_keeper(const LaunchConfig& config, const ProgramCommand& program) {
  char self[4096];
  const ssize_t length = readlink("/proc/self/exe", self, sizeof(self) - 1);
  const KeeperLookup lookup{length > 0 ? std::string(self, static_cast<std::size_t>(length)) : "",
                            std::getenv(kStoreKeeperVariable), program.python_source.empty() ? "" : program.path,
                            config.program};
  return choose_store_keeper(lookup,
                             [](const std::string& path) { return access(path.c_str(), X_OK) == 0 ? 0 : errno; });
}

// A single-node job's store: this host's loopback alone, at --master_port (when the kernel picked none).
StoreSocketPlan single_node_store(const LaunchConfig& config) {
  return plan_store_socket(StoreReach::kLoopback, config.master_addr.find(':') != std::string::npos,
                           config.picked_port ? 0 : config.master_port);
}

int run(const LaunchConfig& config) {
  const ProgramCommand program =
      resolve_program_command(config.program, config.program_args, config.program_mode,
                              {std::getenv("PATH"), std::getenv("PYTHON_EXEC"), std::getenv("VIRTUAL_ENV"),
                               std::getenv("CONDA_PREFIX")});
  const RendezvousSettings rendezvous = rendezvous_settings(config);
  const WorkerSettings workers = worker_settings(config);
  // None when worker rank 0 hosts the store (Note [Opting out of the agent's store] in launch_config.cpp).
  const KeeperChoice keeper = config.agent_store ? find_store_keeper(config, program) : KeeperChoice{};
  if (config.dry_run) {
    const EnvMap parent_env = current_environment();
    if (rendezvous.multi_node()) {
      const std::string node = rendezvous.fixed_ranks() ? "node " + std::to_string(config.node_rank)
                                                        : "first of " + std::to_string(config.min_nodes) + " to join";
      std::cout << "cpprun: dry run of one node of " << rendezvous.nnodes_flag() << ": the ranks below assume it is "
                << node << " and every node runs --nproc_per_node=" << config.nproc_per_node
                << "; real ranks and the workers' MASTER_PORT (a free port on the first node) come from the "
                << "rendezvous at " << endpoint_text(config) << "\n";
    }
    if (!program.python_source.empty()) {
      std::cout << "cpprun: Python runs " << config.program << ": " << program.path << " (" << program.python_source
                << "; set PYTHON_EXEC to choose another)\n";
    }
    RankLayout layout = assumed_layout(rendezvous);
    const StoreSocketPlan store = single_node_store(config);
    if (!rendezvous.multi_node()) layout.master_addr = store.addresses.front();
    // With the job secret every node's workers reach the store through their agent's tunnel, on
    // this host's loopback (Note [Store tunnel wired]): the dry run showed --master_addr instead.
    if (rendezvous.multi_node() && config.agent_store && !rendezvous.job_secret.empty()) {
      layout.master_addr = loopback_family_for(rendezvous.host) == LoopbackFamily::kIpv6 ? "::1" : "127.0.0.1";
    }
    const std::string port = store.port != 0 ? std::to_string(store.port) : "a port the kernel picks";
    if (config.agent_store) {
      std::cout << "cpprun: the workers' c10d store: " << keeper.path << " (" << keeper.source << ") would serve it"
                << (rendezvous.multi_node() ? " on the node hosting the rendezvous"
                                            : " at " + store.addresses.front() + ":" + port)
                << " (TORCHELASTIC_USE_AGENT_STORE=True)\n";
    } else {
      // A c10d job of one node with an endpoint: MASTER_ADDR as round_plan.cpp gives it, a free port then.
      const std::string where = rendezvous.multi_node()
                                    ? (config.local_addr.empty() ? config.master_addr : config.local_addr) +
                                          " (a port free on this node when the rendezvous completes)"
                                    : store.addresses.front() + ":" + port;
      std::cout << "cpprun: the workers' c10d store: worker rank 0 would host it at " << where
                << " (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: TORCHELASTIC_USE_AGENT_STORE=False)\n";
    }
    std::cout << format_dry_run(make_worker_specs(workers, layout, program, 0,
                                                  RunLayout::planned(config.output.log_dir, config.run_id,
                                                                     config.output.writes_files()),
                                                  parent_env),
                                parent_env);
    return 0;
  }
  if (!program.python_source.empty()) {
    std::cerr << python_choice_line(config.program, config.program_mode, program) << std::endl;
  }
  check_meeting_host_resolves(rendezvous);
  // Before the environment is read for the workers, who inherit its token, and before any thread.
  const JobProcessTree tree(config.shutdown_timeout);
  // torchrun's watchdog pipe; the workers inherit TORCHELASTIC_TIMER_FILE from cpprun's environment.
  std::optional<FileTimerServer> file_timer;
  const auto getenv_opt = [](const char* name) -> std::optional<std::string> {
    const char* value = std::getenv(name);
    return value != nullptr ? std::optional<std::string>(value) : std::nullopt;
  };
  const char* tmpdir = std::getenv("TMPDIR");
  if (const auto path = file_timer_path(getenv_opt("TORCHELASTIC_ENABLE_FILE_TIMER"),
                                        getenv_opt("TORCHELASTIC_TIMER_FILE"),
                                        tmpdir != nullptr && *tmpdir != '\0' ? tmpdir : "/tmp", random_uuid4())) {
    file_timer.emplace(*path, "CPPRUN_JOB_TOKEN=" + getenv_opt("CPPRUN_JOB_TOKEN").value_or(""));
    setenv("TORCHELASTIC_TIMER_FILE", path->c_str(), 1);
  }
  const EnvMap parent_env = current_environment();
  if (defaults_omp_threads(config.nproc_per_node, parent_env)) {
    std::cerr << "cpprun: setting OMP_NUM_THREADS=1 for each of the " << config.nproc_per_node
              << " workers so they do not overload the CPU; set OMP_NUM_THREADS yourself to tune it\n";
  }
  SignalRelay relay(listed_user_signals(config.signals_to_handle));  // Note [SIGUSR1 and SIGUSR2]
  const RunDirectory run_dir(config.output.log_dir, config.run_id, config.output.writes_files(),
                             /*private_files=*/config.program_mode == ProgramMode::kRunPath);
  if (!run_dir.removed_stale().empty()) {
    std::cerr << "cpprun: removed " << run_dir.removed_stale().size() << " temp "
              << (run_dir.removed_stale().size() == 1 ? "dir" : "dirs") << " of cpprun runs that were killed:";
    for (const std::string& path : run_dir.removed_stale()) std::cerr << " " << path;
    std::cerr << "\n";
  }
  if (!run_dir.made_log_dir().empty()) {
    std::cerr << "cpprun: --redirects/--tee without --log_dir: the workers' files go to " << run_dir.layout().dir
              << " (kept, as torchrun's)\n";
  }
  const KeeperSettings keeper_settings{keeper, to_env_strings(make_keeper_env(parent_env))};
  if (rendezvous.multi_node()) {
    return run_multi_node(rendezvous, workers, program, parent_env, keeper_settings, relay, run_dir);
  }

  RestartPacer pacer(config.restart_backoff);
  // Note [A fixed store port is held between rounds] (workers/store_keeper.h).
  std::optional<StoreSocket> held_store_socket;
  if (config.agent_store && !config.picked_port) held_store_socket.emplace(single_node_store(config), "--master_port");
  for (int restart = 0;; ++restart) {
    run_dir.prepare_attempt(restart, config.nproc_per_node, config.output.filtered_logs());
    // A new store each attempt, on this host's loopback alone (Note [Store keeper]); or, opted out of
    // (config.agent_store), a free port there where worker rank 0 hosts it, as torchrun's c10d handler.
    std::optional<StoreKeeper> store;
    RankLayout ranks = single_node_layout(config.nproc_per_node);
    if (config.agent_store) {
      if (held_store_socket) {
        held_store_socket->drop_waiting_connections();  // Note [A fixed store port is held between rounds]
        store.emplace(keeper_settings, *held_store_socket, relay);
      } else {
        store.emplace(keeper_settings, single_node_store(config), "", relay);
      }
      ranks.master_addr = store->address();
      ranks.master_port = store->port();
    } else {
      ranks.master_addr = single_node_store(config).addresses.front();
      ranks.master_port = pick_free_port();
    }
    const std::vector<WorkerSpec> specs =
        make_worker_specs(workers, ranks, program, restart, run_dir.layout(), parent_env);
    pacer.attempt_started();
    std::optional<StoreKeeperWatch> watch;  // the keeper's end ends the attempt
    if (store) watch.emplace(*store);
    const AttemptEnd attempt = run_attempt(relay, specs, config.shutdown_timeout, workers.uninterruptible_state,
                                           watch ? &*watch : nullptr, nullptr, run_dir.layout().diagnosis_file(restart));
    if (store) store->stop();  // the workers are gone: their store with them, before any restart's wait
    if (attempt.end == GroupEnd::kSucceeded) return 0;
    if (attempt.end == GroupEnd::kInterrupted) return attempt.exit_code;
    if (attempt.end == GroupEnd::kUnhealthy) {  // Note [An unhealthy attempt] in workers/attempt.h
      hand_over_error_file(attempt);
      std::cerr << "cpprun: exiting with code " << attempt.exit_code << " (no restart, as torchrun's agent): "
                << attempt.root_worker << " " << attempt.root_how << "\n";
      return attempt.exit_code;
    }
    if (attempt.end == GroupEnd::kPeerEnded) {
      std::cerr << "cpprun: exiting with code 1: " << watch->end_reason() << "\n";
      return 1;
    }

    if (restart >= config.max_restarts) {
      if (attempt.end == GroupEnd::kWorkerFailed) hand_over_error_file(attempt);
      const std::string gave_up = "giving up after " + std::to_string(restart + 1) + " attempts (--max_restarts=" +
                                  std::to_string(config.max_restarts) + "); ";
      std::cerr << "cpprun: " << (config.max_restarts > 0 ? gave_up : "") << "exiting with code " << attempt.exit_code
                << " from " << attempt.root_worker << "\n";
      return attempt.exit_code;
    }
    const auto restart_at = pacer.restart_at(restart + 1, config.max_restarts);
    const auto answer_while_waiting = [&] {
      const auto left = std::chrono::ceil<std::chrono::seconds>(restart_at - std::chrono::steady_clock::now());
      answer_diagnose_without_workers("no worker runs; cpprun restarts them in " +
                                      std::to_string(std::max<long long>(0, left.count())) + " s (restart " +
                                      std::to_string(restart + 1) + " of --max_restarts=" +
                                      std::to_string(config.max_restarts) + "): ask again then");
    };
    if (const int sig = sleep_until(relay, restart_at, answer_while_waiting); sig != 0) {
      std::cerr << "cpprun: received " << signal_name(sig) << " while waiting to restart; exiting with code "
                << 128 + sig << " (no worker was running)\n";
      return 128 + sig;
    }
    std::cerr << "cpprun: restarting all workers (restart " << restart + 1 << " of --max_restarts="
              << config.max_restarts << ", TORCHELASTIC_RESTART_COUNT=" << restart + 1 << ")\n";
  }
}

}  // namespace

int main(int argc, char** argv) {
  ensure_standard_fds();
  route_stderr_through_sink();  // Note [The launcher's own lines] in workers/console_sink.h
  // cpprun's own sub-command, apart from torchrun's options: `cpprun --diagnose PID`.
  if (argc >= 2 && std::string(argv[1]).rfind("--diagnose", 0) == 0) {
    const std::string first = argv[1];
    if (first == "--diagnose" && argc == 3) return request_diagnosis(argv[2], std::chrono::seconds(30));
    if (first.rfind("--diagnose=", 0) == 0 && argc == 2) return request_diagnosis(first.substr(11), std::chrono::seconds(30));
    std::cerr << "cpprun: usage: cpprun --diagnose PID (the process id of a running cpprun)\n";
    return kUsageExitCode;
  }
  try {
    const ParsedCommandLine cli = parse_launch_config({argv + 1, argv + argc}, probe_host());
    if (!cli.scheduler_note.empty()) std::cerr << cli.scheduler_note << std::endl;
    for (const std::string& note : cli.notes) std::cerr << note << std::endl;
    if (cli.outcome == CliOutcome::kShowHelp) {
      std::cout << cli.help_text;
      return 0;
    }
    raise_open_file_limit();  // the workers get the caller's back (workers/open_file_limit.h)
    const int exit_code = run(cli.config);
    // Note [A signal in the launcher's error file]
    // torchrun's agent turns SIGTERM, SIGINT, SIGHUP and SIGQUIT into a SignalException that its
    // @record main writes to the launcher's TORCHELASTIC_ERROR_FILE ("SignalException: Process PID got
    // signal: 15"), where a scheduler (TorchX) reads why the job ended: written here when the job
    // ended because of the signal (exit 128 + it), after the workers were stopped, as torchrun does.
    if (const int sig = job_ending_signal_received(); sig != 0 && exit_code == 128 + sig) {
      record_launcher_error("SignalException: Process " + std::to_string(getpid()) + " got signal: " +
                            std::to_string(sig));
    }
    return exit_code;
  } catch (const UsageError& e) {
    std::cerr << "cpprun: " << e.what() << "\n";
    return kUsageExitCode;
  } catch (const ProgramNotRunnable& e) {
    return report(e, e.exit_code());
  } catch (const SpawnError& e) {
    return report(e, e.exit_code());
  } catch (const StoreKeeperError& e) {
    return report(e, e.exit_code());
  } catch (const RendezvousError& e) {  // the other nodes were told, or see this agent's link close
    return report(e, e.exit_code());
  } catch (const std::system_error& e) {  // the run's files (--log_dir, the temp dir, pipes), named
    return report(e, 1);
  } catch (const std::exception& e) {
    // Workers were already stopped while unwinding (~WorkerGroup).
    std::cerr << "cpprun: internal error: " << e.what() << "\n";
    record_launcher_error(std::string("cpprun: internal error: ") + e.what());
    return 1;
  }
}
