// Rounds of this node's workers, coordinated with the other nodes through NodeRendezvous.
#include <algorithm>
#include <iostream>
#include <memory>

#include "common/job_secret.h"
#include "rendezvous/node_rendezvous.h"
#include "rendezvous/socket_interface.h"
#include "workers/error_file.h"
#include "workers/flight_requests.h"

namespace cpprun::launcher {

// Note [A job's root cause]
// Each node names the first of its own workers to fail ("failed first on this node"), as each
// torchrun agent names its own; why the job ends is node 0's decision (the first failure it hears
// of, unless a stronger end outranks it: a lost node, a signal, a stuck worker), which every
// node's exit line gives and whose exit code every node exits with. Workers on two nodes can fail
// before either node hears of the other's failure: each node then names its own, and a node whose
// own failure is not what the job ends for says so above its exit line, so that no console calls
// two workers the root cause.

int run_multi_node(const RendezvousSettings& settings, const WorkerSettings& workers, const ProgramCommand& program,
                   const EnvMap& parent_env, const KeeperSettings& keeper, SignalRelay& relay,
                   const RunDirectory& run_dir) {
  if (settings.job_secret.empty()) std::cerr << no_secret_warning(settings.endpoint()) << "\n";  // --no_job_secret
  if (!settings.job_secret_note.empty()) std::cerr << settings.job_secret_note << "\n";
  int signal = 0;
  const std::unique_ptr<NodeRendezvous> rendezvous = open_rendezvous(settings, keeper, relay, signal);
  std::optional<RankLayout> layout;
  if (rendezvous) layout = rendezvous->join(relay, signal);
  if (!layout) {
    std::cerr << "cpprun: received " << signal_name(signal) << " while waiting for the other nodes; exiting\n";
    return 128 + signal;
  }
  std::string interface_said;  // said once, and again only if a new round changes it
  for (;;) {
    const int restart_count = rendezvous->restart_count();
    const std::string this_node = "node " + std::to_string(layout->group_rank);
    run_dir.prepare_attempt(restart_count, workers.env.local_world_size, workers.output.filtered_logs());
    const InterfaceChoice interface =
        choose_socket_interface(rendezvous->link_addresses(), interface_addresses(), parent_env);
    if (const std::string said = describe_interface_choice(
            interface, layout->group_rank, layout->group_rank == 0 ? LinkSide::kHost : LinkSide::kMember);
        !said.empty() && said != interface_said) {
      std::cerr << said << "\n";
      interface_said = said;
    }
    EnvMap round_env = parent_env;
    for (const auto& [name, value] : interface.variables) round_env[name] = value;
    const std::vector<WorkerSpec> specs =
        make_worker_specs(workers, *layout, program, restart_count, run_dir.layout(), round_env);
    const auto failure = [&](const AttemptEnd& attempt) {
      return attempt.root_worker + " on " + this_node + " " + attempt.root_how;
    };
    // Told before this node's workers are stopped, so every node stops at once.
    const auto tell_others = [&](const AttemptEnd& attempt) {
      switch (attempt.end) {
        case GroupEnd::kWorkerFailed:
          rendezvous->report_failed({attempt.exit_code, true, failure(attempt)});
          break;
        case GroupEnd::kUnhealthy:  // not restartable: Note [An unhealthy attempt] in workers/attempt.h
          rendezvous->report_failed({attempt.exit_code, false, failure(attempt)});
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
    // One diagnosis over every node's ranks, on node 0: Note [One diagnosis for several nodes].
    bool evidence_sent = false;
    EvidenceRoute route;
    route.share = [&](const std::vector<RankEvidence>& evidence) {
      evidence_sent = rendezvous->share_evidence(evidence);
    };
    route.report = [&](const std::vector<RankEvidence>& evidence, const std::string& why, const std::string& file) {
      if (const std::optional<MergedEvidence> all = rendezvous->collect_evidence(relay, kEvidenceWait)) {
        for (const std::string& refused : all->refused) std::cerr << "cpprun: warning: " << refused << "\n";
        // The reason every node was told, which names the node where it began.
        report_diagnosis(all->ranks, rendezvous->attempt_ended() ? rendezvous->peer_end().reason : why, file);
      } else if (!evidence_sent) {
        report_diagnosis(evidence, why, file);  // node 0 cannot be told: this node's part, here
      } else if (std::any_of(evidence.begin(), evidence.end(), [](const RankEvidence& e) { return e.dump; })) {
        std::cerr << "cpprun: diagnosis: this node's ranks' flight-recorder dumps went to node 0, which prints one "
                     "diagnosis over every node's ranks\n";
      }
    };
    const AttemptEnd attempt = run_attempt(relay, specs, settings.shutdown_timeout, workers.uninterruptible_state,
                                           rendezvous.get(), tell_others,
                                           run_dir.layout().diagnosis_file(restart_count), &route);
    if (attempt.end == GroupEnd::kSucceeded) rendezvous->report_done();
    // A signal ends the job on every node; this one does not wait for the others' news.
    if (attempt.end == GroupEnd::kInterrupted) return attempt.exit_code;

    const JobDecision decision = rendezvous->decide(relay);
    if (const auto late = rendezvous->take_late_evidence()) {  // this node's workers had succeeded
      for (const std::string& refused : late->merged.refused) std::cerr << "cpprun: warning: " << refused << "\n";
      report_diagnosis(late->merged.ranks, late->why, run_dir.layout().diagnosis_file(restart_count));
    }
    switch (decision.kind) {
      case JobDecision::Kind::kFinish:
        return 0;
      case JobDecision::Kind::kRestart:
        layout = decision.layout;
        if (rendezvous->restart_count() > restart_count) {  // after a failure, else (c10d) for new nodes
          std::cerr << "cpprun: restarting the workers of all " << layout->group_world_size << " nodes (restart "
                    << rendezvous->restart_count() << " of --max_restarts=" << settings.max_restarts
                    << ", TORCHELASTIC_RESTART_COUNT=" << rendezvous->restart_count() << ")\n";
        } else {
          std::cerr << "cpprun: rendezvous round " << rendezvous->round() << ": the nodes changed; restarting this "
                    << "node's workers as node " << layout->group_rank << " of " << layout->group_world_size
                    << " (WORLD_SIZE=" << layout->world_size << "; a membership change, not counted against "
                    << "--max_restarts: TORCHELASTIC_RESTART_COUNT stays " << rendezvous->restart_count() << ")\n";
        }
        continue;
      case JobDecision::Kind::kExit:
        if (attempt.end == GroupEnd::kWorkerFailed || attempt.end == GroupEnd::kUnhealthy) {
          hand_over_error_file(attempt);
          if (decision.end.reason != failure(attempt)) {  // Note [A job's root cause]
            std::cerr << "cpprun: the job ends for the reason node 0 decided (below), not for this node's own: "
                      << attempt.root_worker << " " << attempt.root_how << "\n";
          }
        }
        std::cerr << "cpprun: ";
        if (decision.end.restartable && settings.max_restarts > 0) {
          std::cerr << "giving up after " << restart_count + 1 << " attempts (--max_restarts=" << settings.max_restarts
                    << "); ";
        }
        std::cerr << "exiting with code " << decision.end.exit_code << ": " << decision.end.reason << "\n";
        return decision.end.exit_code;
    }
  }
}

}  // namespace cpprun::launcher
