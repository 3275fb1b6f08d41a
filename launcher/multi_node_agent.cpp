// Rounds of this node's workers, coordinated with the other nodes through NodeRendezvous.
#include "multi_node_agent.h"

#include <iostream>
#include <memory>

#include "attempt.h"
#include "node_rendezvous.h"
#include "worker_specs.h"
#include "worker_status.h"

namespace cpprun::launcher {

int run_multi_node(const LaunchConfig& config, const std::string& program_path, const EnvMap& parent_env,
                   SignalRelay& relay, const RunDirectory& run_dir) {
  const std::unique_ptr<NodeRendezvous> rendezvous =
      config.node_rank == 0 ? make_rendezvous_host(config) : make_rendezvous_member(config);
  const std::string this_node = "node " + std::to_string(config.node_rank);
  int signal = 0;
  std::optional<RankLayout> layout = rendezvous->join(relay, signal);
  if (!layout) {
    std::cerr << "cpprun: received " << signal_name(signal) << " while waiting for the other nodes; exiting\n";
    return 128 + signal;
  }
  for (;;) {
    const int round = rendezvous->round();
    run_dir.prepare_attempt(round, config.nproc_per_node);
    const std::vector<WorkerSpec> specs =
        make_worker_specs(config, *layout, program_path, round, run_dir.layout(), parent_env);
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
               describe_agent(config.node_rank, "") + " received " + signal_name(attempt.signal)});
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
        std::cerr << "cpprun: restarting the workers of all " << config.nnodes << " nodes (restart "
                  << rendezvous->round() << " of --max_restarts=" << config.max_restarts
                  << ", TORCHELASTIC_RESTART_COUNT=" << rendezvous->round() << ")\n";
        layout = decision.layout;
        continue;
      case JobDecision::Kind::kExit:
        std::cerr << "cpprun: ";
        if (decision.end.restartable && config.max_restarts > 0) {
          std::cerr << "giving up after " << round + 1 << " attempts (--max_restarts=" << config.max_restarts
                    << "); ";
        }
        std::cerr << "exiting with code " << decision.end.exit_code << ": " << decision.end.reason << "\n";
        return decision.end.exit_code;
    }
  }
}

}  // namespace cpprun::launcher
