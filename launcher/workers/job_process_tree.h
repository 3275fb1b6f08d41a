// Keeping every process the workers start inside the job, so that none outlives it.
//
// Note [The job's process tree]
// 1. cpprun is a child subreaper, so orphans (even setsid()ed or double-forked ones) become its
//    children: once an attempt's workers are reaped, stop_leftovers() SIGTERMs, then SIGKILLs them.
// 2. During the attempt, forwarded signals reach each worker's whole process group, and a failed or
//    stopped worker's group is SIGKILLed with it (Note [Orphans in a worker's process group]).
// 3. If cpprun is SIGKILLed, its workers die by PR_SET_PDEATHSIG; a guardian in its own session sees
//    cpprun's socket close and SIGKILLs every process whose environment holds this run's random
//    CPPRUN_JOB_TOKEN, which workers inherit (as Jenkins finds a build's processes). The guardian passes
//    the signals cpprun handles on to cpprun (Note [The guardian relays the launcher's signals]).
// Not covered (only a cgroup holds these, and cpprun may not create one): after a SIGKILL of cpprun,
// a process that dropped the token (env -i) or whose environment we may not read; always, one that
// leaves through a subreaper of its own (a container runtime, systemd --user) or a service (systemd-run, at).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace cpprun::launcher {

class SignalRelay;

// The guardian's process name (/proc/PID/comm, what ps shows; at most 15 characters). It keeps
// cpprun's command line, so that `cpprun --diagnose` can tell it from the cpprun it guards.
inline constexpr const char* kGuardianName = "cpprun-guardian";

class JobProcessTree {
 public:
  // Starts the guardian, sets CPPRUN_JOB_TOKEN in this process's environment and makes cpprun a child
  // subreaper. Create it before any thread or worker starts and before the workers' environment is read.
  // `shutdown_timeout` (--shutdown_timeout) paces the job's end: Note [The wait after SIGKILL] in kill_wait.h.
  explicit JobProcessTree(std::chrono::milliseconds shutdown_timeout);
  // SIGKILLs whatever is left (an exception may have cut an attempt short) and waits for it as any
  // stop does (Note [The wait after SIGKILL]: 30 s or more for one SIGKILL does not end), then
  // dismisses the guardian.
  ~JobProcessTree();
  JobProcessTree(const JobProcessTree&) = delete;
  JobProcessTree& operator=(const JobProcessTree&) = delete;

 private:
  int guardian_line_ = -1;  // cpprun's end of the socket the guardian waits on
  std::chrono::milliseconds shutdown_timeout_;
};

// Once an attempt's workers are all reaped: SIGTERMs every child cpprun still has (named on stderr)
// but its helpers, waits up to `grace`, then SIGKILLs (and waits: Note [The wait after SIGKILL]).
// Returns the first job-ending signal that came meanwhile (one cuts the grace short, not the wait
// after SIGKILL), or 0. A `cpprun --diagnose` meanwhile is answered: no worker runs.
int stop_leftovers(SignalRelay& relay, std::chrono::milliseconds grace);

// Note [The job's helpers]
// Children cpprun starts for the job besides its workers -- the workers' store keeper (store_keeper.h),
// which outlives an attempt's workers until its round is over -- are neither workers nor leftovers:
// stop_leftovers() leaves them running (~JobProcessTree kills whatever is left at the end), and a
// reaper that takes any child (waitpid(-1): an attempt's, for adopted orphans, or stop_leftovers')
// keeps a helper's wait status here for its owner, who would otherwise never learn how it ended.
void add_job_helper(pid_t pid);
// For a waitpid(-1) caller: whether `pid` is a helper; if so its `status` is kept for forget_job_helper().
bool keep_helper_status(pid_t pid, int status);
// Helper `pid`'s wait status if another reaper kept it (then `pid` may name another process now).
std::optional<int> reaped_helper_status(pid_t pid);
// Forgets helper `pid`; returns its wait status if another reaper kept it.
std::optional<int> forget_job_helper(pid_t pid);

// `pid`, a child of cpprun SIGKILLed and still not ended: given up on (Note [A worker SIGKILL cannot
// end] in attempt.cpp). stop_leftovers() and the job's end leave it alone; it is reaped like any child
// if it ends while cpprun runs, by init (or an outer subreaper) if later. Its live descendants are
// SIGKILLed (they would outlive the job once it ends); returns how many.
std::size_t abandon_child(pid_t pid);
// For a waitpid(-1) caller: `pid` was reaped; if it had been given up on, it is no longer.
void forget_abandoned(pid_t pid);

// The live (not zombie) processes descended from `root`, children first. A snapshot of /proc: one
// forked meanwhile may be missed.
std::vector<pid_t> live_descendants(pid_t root);

// The whole of a /proc file, or "" if it cannot be opened or read (the process is gone, or not ours).
std::string read_proc_file(const std::string& path);

// The live (not zombie) children of `parent`, from every /proc/PID/stat: /proc/PID/task/*/children
// may leave out some while others exit (proc_tid_children(5)), as leftovers do when told to stop.
std::vector<pid_t> live_children(pid_t parent);

// The live processes whose initial environment (/proc/PID/environ) holds `entry` ("NAME=VALUE")
// exactly; not those of other users, whose environment cannot be read.
std::vector<pid_t> processes_with_env_entry(const std::string& entry);

}  // namespace cpprun::launcher
