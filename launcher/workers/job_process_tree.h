// Keeping every process the workers start inside the job, so that none outlives it.
//
// Note [The job's process tree]
// Whatever a worker starts belongs to the job and must end with it, whichever way the job ends.
// Three mechanisms, each covering what the others cannot:
// 1. cpprun is a child subreaper (PR_SET_CHILD_SUBREAPER): a process whose parent dies is
//    reparented to cpprun rather than to init, even one that called setsid() or double-forked to
//    become a daemon. So once an attempt's workers are all reaped, every child cpprun still has is
//    something they left behind: stop_leftovers() sends those SIGTERM, then SIGKILL after
//    --shutdown_timeout, and does the same to their own children as they are adopted in turn.
//    Orphans that exit while the attempt runs are reaped by WorkerGroup.
// 2. While the attempt runs, each worker's process group gets every signal cpprun forwards, and
//    the group of a failed or stopped worker is SIGKILLed once the workers are stopped
//    (Note [Orphans in a worker's process group]): that reaches a worker's `cmd &` at once.
// 3. A SIGKILLed (or crashed) cpprun does nothing more: its workers die by PR_SET_PDEATHSIG, and
//    their descendants are adopted by whoever is above cpprun. For them a guardian process,
//    started in a session of its own before any worker, waits on a socket to cpprun; when that
//    closes without cpprun having dismissed it, it SIGKILLs every process whose environment holds
//    CPPRUN_JOB_TOKEN=<this run's random token>, which every worker inherits and passes on (how
//    Jenkins finds the processes of a build).
// Not covered: after a SIGKILL of cpprun, a descendant that exec'd with an environment without the
// token (env -i), or one whose environment we may not read (another user's, a setuid program's);
// in every case, a process that leaves the tree through a subreaper of its own below cpprun (a
// container runtime, systemd --user) or that a service starts on a worker's behalf (systemd-run,
// at). A cgroup would hold all of these; cpprun does not assume it may create one.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "workers/signal_relay.h"

namespace cpprun::launcher {

class TreeGuardian;

// The environment variable that marks the processes of one cpprun run.
inline constexpr const char* kJobTokenVariable = "CPPRUN_JOB_TOKEN";

// One per cpprun run that starts workers; see Note [The job's process tree].
class JobProcessTree {
 public:
  // Sets CPPRUN_JOB_TOKEN in this process's environment (workers inherit it: create this before
  // reading the environment for them), starts the guardian and makes cpprun a child subreaper.
  // Call before any thread or worker starts.
  JobProcessTree();
  // SIGKILLs whatever is left (an exception may have cut an attempt short) and dismisses the
  // guardian.
  ~JobProcessTree();
  JobProcessTree(const JobProcessTree&) = delete;
  JobProcessTree& operator=(const JobProcessTree&) = delete;

 private:
  std::unique_ptr<TreeGuardian> guardian_;
};

// Once an attempt's workers are all reaped: stops every child cpprun still has (what the workers
// left behind, adopted by cpprun; see Note [The job's process tree]), saying which on stderr:
// SIGTERM, up to `grace` for them to exit, then SIGKILL, until none is left. A job-ending signal
// arriving meanwhile cuts the grace short; it is returned (0 if none came).
int stop_leftovers(SignalRelay& relay, std::chrono::milliseconds grace);

}  // namespace cpprun::launcher
