// Keeping every process the workers start inside the job, so that none outlives it.
//
// Note [The job's process tree]
// Whatever a worker starts must end with the job, whichever way the job ends. Three mechanisms,
// each covering what the others cannot:
// 1. cpprun is a child subreaper (PR_SET_CHILD_SUBREAPER): an orphan, even one that called setsid()
//    or double-forked, is reparented to cpprun rather than to init. So once an attempt's workers
//    are reaped, every child cpprun still has was left behind by them: stop_leftovers() sends those
//    SIGTERM, then SIGKILL after --shutdown_timeout. Orphans that exit during the attempt are
//    reaped by WorkerGroup.
// 2. While the attempt runs, each worker's process group gets every signal cpprun forwards, and the
//    group of a failed or stopped worker is SIGKILLed once the workers are stopped (Note [Orphans in
//    a worker's process group]): that reaches a worker's `cmd &` at once.
// 3. A SIGKILLed cpprun does nothing more: its workers die by PR_SET_PDEATHSIG, and their
//    descendants go to whoever is above cpprun. For them a guardian process, in a session of its
//    own, waits on a socket to cpprun; when that closes without cpprun having dismissed it, it
//    SIGKILLs every process whose environment holds CPPRUN_JOB_TOKEN=<this run's random token>,
//    which every worker inherits and passes on (how Jenkins finds the processes of a build).
// Not covered: after a SIGKILL of cpprun, a descendant that exec'd without the token (env -i) or
// whose environment we may not read (another user's, setuid); always, a process that leaves the
// tree through a subreaper of its own (a container runtime, systemd --user) or that a service
// starts for a worker (systemd-run, at). A cgroup would hold these; cpprun may not create one.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

#include "workers/signal_relay.h"

namespace cpprun::launcher {

// One per cpprun run that starts workers; see Note [The job's process tree].
class JobProcessTree {
 public:
  // Starts the guardian, sets CPPRUN_JOB_TOKEN in this process's environment (create this before
  // reading the environment for the workers) and makes cpprun a child subreaper. Call before any
  // thread or worker starts.
  JobProcessTree();
  // SIGKILLs whatever is left (an exception may have cut an attempt short), dismisses the guardian.
  ~JobProcessTree();
  JobProcessTree(const JobProcessTree&) = delete;
  JobProcessTree& operator=(const JobProcessTree&) = delete;

 private:
  int guardian_line_ = -1;  // cpprun's end of the socket the guardian waits on
};

// Once an attempt's workers are all reaped: stops every child cpprun still has, naming them on
// stderr: SIGTERM, up to `grace` for them to exit, then SIGKILL, until none is left. A job-ending
// signal arriving meanwhile cuts the grace short; it is returned (0 if none came).
int stop_leftovers(SignalRelay& relay, std::chrono::milliseconds grace);

// What /proc says about other processes. The whole file, or "" if it cannot be read (the process
// is gone, or not ours).
std::string read_proc_file(const std::string& path);

// The live (not zombie) children of `parent`, from /proc/PARENT/task/*/children where the kernel
// has it (CONFIG_PROC_CHILDREN), else by reading every /proc/PID/stat.
std::vector<pid_t> live_children(pid_t parent);

// The live processes whose initial environment (/proc/PID/environ) holds `entry` ("NAME=VALUE")
// exactly. Processes of other users, whose environment cannot be read, are not among them.
std::vector<pid_t> processes_with_env_entry(const std::string& entry);

}  // namespace cpprun::launcher
