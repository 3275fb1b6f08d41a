// Unit tests of what cpprun reads in /proc to find what workers left behind.
#include "catch.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <vector>

#include "workers/job_process_tree.h"

using namespace cpprun::launcher;

namespace {

bool contains(const std::vector<pid_t>& pids, pid_t pid) { return std::find(pids.begin(), pids.end(), pid) != pids.end(); }

// A child running `sleep 30` with `env` as its whole environment.
pid_t start_sleep(const std::vector<std::string>& env) {
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    std::vector<char*> envp;
    for (const std::string& e : env) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);
    char* argv[] = {const_cast<char*>("sleep"), const_cast<char*>("30"), nullptr};
    execve("/bin/sleep", argv, envp.data());
    _exit(127);
  }
  return pid;
}

void stop(pid_t pid) {
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
}

// The child has exec'd once /proc shows sleep's environment, not ours.
void wait_until_found(const std::string& entry, pid_t pid) {
  for (int i = 0; i < 200 && !contains(processes_with_env_entry(entry), pid); ++i) usleep(10000);
}

}  // namespace

TEST_CASE("job_process_tree: live_children lists this process's children, not zombies", "[job_process_tree]") {
  const pid_t child = start_sleep({"A=1"});
  CHECK(contains(live_children(getpid()), child));
  CHECK_FALSE(contains(live_children(getpid()), getpid()));
  kill(child, SIGKILL);
  // Killed but not reaped: a zombie, no longer live.
  siginfo_t info{};
  REQUIRE(waitid(P_PID, static_cast<id_t>(child), &info, WEXITED | WNOWAIT) == 0);
  CHECK_FALSE(contains(live_children(getpid()), child));
  stop(child);
}

TEST_CASE("job_process_tree: processes_with_env_entry matches whole entries only", "[job_process_tree]") {
  const std::string token = "CPPRUN_TEST_PROCESS_TABLE=" + std::to_string(getpid());
  const pid_t first = start_sleep({token, "OTHER=1"});
  const pid_t last = start_sleep({"OTHER=1", token});
  const pid_t longer = start_sleep({token + "0"});
  const pid_t prefixed = start_sleep({"X" + token});
  wait_until_found(token, first);
  wait_until_found(token, last);
  const std::vector<pid_t> found = processes_with_env_entry(token);
  CHECK(contains(found, first));
  CHECK(contains(found, last));
  CHECK_FALSE(contains(found, longer));
  CHECK_FALSE(contains(found, prefixed));
  for (pid_t pid : {first, last, longer, prefixed}) stop(pid);
  CHECK_FALSE(contains(processes_with_env_entry(token), first));
}

TEST_CASE("job_process_tree: read_proc_file returns \"\" when a read fails after the open", "[job_process_tree]") {
  // A process that exits between the open and the read of its /proc file makes read() fail (ESRCH);
  // a directory makes it fail the same way (EISDIR), every time. Neither may throw.
  CHECK(read_proc_file("/proc/self").empty());
  CHECK(read_proc_file("/proc/0/stat").empty());
  const std::string stat = read_proc_file("/proc/self/stat");
  CHECK(stat.rfind(std::to_string(getpid()) + " (", 0) == 0);
}
