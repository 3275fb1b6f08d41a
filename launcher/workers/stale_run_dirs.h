// Temp dirs of cpprun runs that were SIGKILLed: each TEMP/cpprun-XXXXXX (TEMP: run_directory.h's
// temp_root()) records its owner, and a later cpprun removes those whose owner is gone. Note [Stale
// temp dirs].
#pragma once

#include <sys/types.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace cpprun::launcher {

// Who made a temp dir: enough to tell, later and on any machine sharing the file system, that this
// very process is gone. A pid alone is not: another pid namespace (a container sharing /tmp) or
// another machine (TMPDIR on NFS) may run a live cpprun of the same pid, and pids are reused.
struct RunDirOwner {
  std::string boot_id;                // /proc/sys/kernel/random/boot_id: this machine, this boot
  std::string pid_namespace;          // readlink /proc/self/ns/pid: "pid:[4026531836]"
  pid_t pid = 0;
  unsigned long long start_time = 0;  // /proc/PID/stat field 22: clock ticks after boot
};

// The record's text ("cpprun run dir owner v1\nboot_id ...\n...") and back; nullopt for anything
// else, a truncated record included. Pure.
std::string format_owner(const RunDirOwner& owner);
std::optional<RunDirOwner> parse_owner(const std::string& text);

// Whether `recorded` is certainly gone, seen from `self` (this process) with `start_time_of(pid)`
// (nullopt: no such process here): only on the same boot of the same machine, in the same pid
// namespace, and its pid now free or another process's (another start time). Pure.
bool owner_gone(const RunDirOwner& recorded, const RunDirOwner& self,
                const std::function<std::optional<unsigned long long>(pid_t)>& start_time_of);

// This process, or nullopt where /proc cannot say (then no record is written, and nothing swept).
std::optional<RunDirOwner> this_process_owner();

// The record's file in a run's temp dir.
inline constexpr const char* kOwnerRecord = ".cpprun-owner";

// Writes the record into `dir` (just made by this process); best effort: without one the dir is
// never swept.
void record_owner(const std::string& dir);

// Removes each `root`/cpprun-XXXXXX (6 characters of mkdtemp's) that is a directory, not a symlink,
// owned by this uid, whose record says its owner is gone (owner_gone); nothing else. Returns the
// paths removed. Best effort: what cannot be read or removed stays.
std::vector<std::string> remove_stale_run_dirs(const std::string& root);

}  // namespace cpprun::launcher
