// The agent of one node in a multi-node job (--nnodes > 1, or --rdzv_backend=c10d): joins the
// rendezvous, then runs rounds of this node's workers until every node succeeded, the job failed,
// or its restarts ran out.
#pragma once

#include <string>

#include "command_line/program_command.h"
#include "rendezvous/rendezvous_settings.h"
#include "workers/run_directory.h"
#include "workers/signal_relay.h"
#include "workers/worker_specs.h"

namespace cpprun::launcher {

// Returns cpprun's exit code. Throws RendezvousError when the nodes cannot meet.
int run_multi_node(const RendezvousSettings& settings, const WorkerSettings& workers, const ProgramCommand& program,
                   const EnvMap& parent_env, SignalRelay& relay, const RunDirectory& run_dir);

}  // namespace cpprun::launcher
