// The launcher's open-file limit: raised to the hard limit for itself, the caller's put back in
// each worker. cpprun holds about three descriptors a worker while they run (their output pipes,
// a log file) and six while starting them, so a node of 170 or more workers (--nproc_per_node
// auto on a large CPU host) met the usual soft limit of 1024 in pipe2(), where torchrun starts
// them. The workers keep the limit they were given: a program that select()s on descriptors
// below FD_SETSIZE, or counts on the limit, sees what it would see under torchrun.
#pragma once

#include <string>

namespace cpprun::launcher {

// Raises this process's soft RLIMIT_NOFILE to its hard limit (at most 2^20), remembering the one
// it had. Call once, before any worker starts; failing to raise it is not an error.
void raise_open_file_limit();
// In a forked worker before exec: the soft limit the launcher had before raise_open_file_limit.
// Async-signal-safe (one system call).
void restore_open_file_limit_in_child() noexcept;
// For an error that ran out of descriptors (EMFILE): the limit, and what to do ("" for others).
std::string open_file_limit_hint(int error);

}  // namespace cpprun::launcher
