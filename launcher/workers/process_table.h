// What /proc says about other processes: whose children they are, what their environment holds.
// Read when a job ends, to find what its workers left behind (job_process_tree.h).
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace cpprun::launcher {

// The whole file, or "" if it cannot be read (the process is gone, or not ours).
std::string read_proc_file(const std::string& path);

// The live (not zombie) children of `parent`, from /proc/PARENT/task/*/children where the kernel
// has it (CONFIG_PROC_CHILDREN), else by reading every /proc/PID/stat.
std::vector<pid_t> live_children(pid_t parent);

// The live processes whose initial environment (/proc/PID/environ) holds `entry` ("NAME=VALUE")
// exactly. Processes of other users, whose environment cannot be read, are not among them.
std::vector<pid_t> processes_with_env_entry(const std::string& entry);

}  // namespace cpprun::launcher
