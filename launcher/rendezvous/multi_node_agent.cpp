// Rounds of this node's workers, coordinated with the other nodes through NodeRendezvous.
#include "rendezvous/multi_node_agent.h"

#include <iostream>
#include <memory>

#include "workers/attempt.h"
#include "rendezvous/job_secret.h"
#include "rendezvous/node_rendezvous.h"
#include "workers/worker_specs.h"
#include "workers/worker_status.h"

namespace cpprun::launcher {
namespace {

RendezvousSettings rendezvous_settings(const LaunchConfig& config) {
  RendezvousSettings settings;
  settings.backend = config.rdzv_backend;
  settings.min_nodes = config.min_nodes;
  settings.max_nodes = config.max_nodes;
  settings.node_rank = config.rdzv_backend == RendezvousBackend::kStatic ? config.node_rank : -1;
  settings.host = config.master_addr;
  settings.port = config.master_port;
  settings.join_timeout = config.join_timeout;
  settings.last_call_timeout = config.last_call_timeout;
  settings.is_host = config.is_host;
  settings.max_restarts = config.max_restarts;
  settings.restart_backoff = config.restart_backoff;
  settings.shutdown_timeout = config.shutdown_timeout;
  settings.run_id = config.run_id;
  settings.shape = {config.nproc_per_node, config.role};
  settings.job_secret = config.job_secret;
  return settings;
}

// Why the workers start again: a restart after a failure, or (c10d) a new set of nodes.
void announce_restart(const LaunchConfig& config, const NodeRendezvous& rendezvous, const RankLayout& layout,
                      int previous_restart_count) {
  const int restarts = rendezvous.restart_count();
  if (restarts > previous_restart_count) {
    std::cerr << "cpprun: restarting the workers of all " << layout.group_world_size << " nodes (restart "
              << restarts << " of --max_restarts=" << config.max_restarts
              << ", TORCHELASTIC_RESTART_COUNT=" << restarts << ")\n";
    return;
  }
  std::cerr << "cpprun: rendezvous round " << rendezvous.round() << ": the nodes changed; restarting this node's "
            << "workers as node " << layout.group_rank << " of " << layout.group_world_size << " (WORLD_SIZE="
            << layout.world_size << "; a membership change, not counted against --max_restarts: "
            << "TORCHELASTIC_RESTART_COUNT stays " << restarts << ")\n";
}

}  // namespace

int run_multi_node(const LaunchConfig& config, const ProgramCommand& program, const EnvMap& parent_env,
                   SignalRelay& relay, const RunDirectory& run_dir) {
  if (config.no_job_secret) std::cerr << no_secret_warning(endpoint_text(config)) << "\n";
  int signal = 0;
  const std::unique_ptr<NodeRendezvous> rendezvous = open_rendezvous(rendezvous_settings(config), relay, signal);
  std::optional<RankLayout> layout;
  if (rendezvous) layout = rendezvous->join(relay, signal);
  if (!layout) {
    std::cerr << "cpprun: received " << signal_name(signal) << " while waiting for the other nodes; exiting\n";
    return 128 + signal;
  }
  for (;;) {
    const int restart_count = rendezvous->restart_count();
    const std::string this_node = "node " + std::to_string(layout->group_rank);
    run_dir.prepare_attempt(restart_count, config.nproc_per_node);
    const std::vector<WorkerSpec> specs =
        make_worker_specs(config, *layout, program, restart_count, run_dir.layout(), parent_env);
    // Told before this node's workers are stopped, so every node stops at once.
    const auto tell_others = [&](const AttemptEnd& attempt) {
      switch (attempt.end) {
        case GroupEnd::kWorkerFailed:
          rendezvous->report_failed(
              {attempt.exit_code, true, attempt.root_worker + " on " + this_node + " " + attempt.root_how});
          break;
        case GroupEnd::kInterrupted:
          rendezvous->report_interrupted(
              {attempt.exit_code, false,
               describe_agent(layout->group_rank, "") + " received " + signal_name(attempt.signal)});
          break;
        case GroupEnd::kPeerEnded:
          std::cerr << "cpprun: stopping this node's workers: " << rendezvous->peer_end().reason << "\n";
          break;
        case GroupEnd::kSucceeded:
          break;
      }
    };
    const AttemptEnd attempt = run_attempt(relay, specs, config, rendezvous.get(), tell_others);
    if (attempt.end == GroupEnd::kSucceeded) rendezvous->report_done();
    // A signal ends the job on every node; this one does not wait for the others' news.
    if (attempt.end == GroupEnd::kInterrupted) return attempt.exit_code;

    const JobDecision decision = rendezvous->decide(relay);
    switch (decision.kind) {
      case JobDecision::Kind::kFinish:
        return 0;
      case JobDecision::Kind::kRestart:
        layout = decision.layout;
        announce_restart(config, *rendezvous, *layout, restart_count);
        continue;
      case JobDecision::Kind::kExit:
        std::cerr << "cpprun: ";
        if (decision.end.restartable && config.max_restarts > 0) {
          std::cerr << "giving up after " << restart_count + 1 << " attempts (--max_restarts=" << config.max_restarts
                    << "); ";
        }
        std::cerr << "exiting with code " << decision.end.exit_code << ": " << decision.end.reason << "\n";
        return decision.end.exit_code;
    }
  }
}

}  // namespace cpprun::launcher
