// A small process that outlives a killed cpprun just long enough to stop what its job left
// behind. See Note [The job's process tree] in job_process_tree.h.
#pragma once

#include <string>

namespace cpprun::launcher {

class TreeGuardian {
 public:
  // Starts the guardian (not as a child of this process). If this process ends without dismissing it (SIGKILL, a crash, SIGPIPE),
  // the guardian SIGKILLs every process whose environment holds `token_entry` ("NAME=VALUE"), then
  // exits. Call before any thread starts: the child runs on without exec.
  explicit TreeGuardian(const std::string& token_entry);
  // Dismisses the guardian and waits until it has exited.
  ~TreeGuardian();
  TreeGuardian(const TreeGuardian&) = delete;
  TreeGuardian& operator=(const TreeGuardian&) = delete;

 private:
  int line_ = -1;  // cpprun's end of the socket the guardian waits on; its EOF means cpprun is gone
};

}  // namespace cpprun::launcher
