// The subreaper, the job token, and stopping what the workers left behind.
#include "workers/job_process_tree.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <set>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include "rendezvous/link_auth.h"
#include "workers/process_table.h"
#include "workers/tree_guardian.h"

namespace cpprun::launcher {
namespace {

using Clock = std::chrono::steady_clock;

// Reaps every child that has exited; all are leftovers here (stop_leftovers runs without workers).
void reap_exited() {
  int status = 0;
  pid_t got = 0;
  do {
    got = waitpid(-1, &status, WNOHANG);
  } while (got > 0 || (got < 0 && errno == EINTR));
}

// "1234 (sleep)"
std::string describe_process(pid_t pid) {
  int fd = open(("/proc/" + std::to_string(pid) + "/comm").c_str(), O_RDONLY | O_CLOEXEC);
  std::string name;
  if (fd >= 0) {
    char buffer[64];
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n > 0) name.assign(buffer, static_cast<std::size_t>(n));
    close(fd);
  }
  while (!name.empty() && name.back() == '\n') name.pop_back();
  return std::to_string(pid) + (name.empty() ? "" : " (" + name + ")");
}

std::string describe_processes(const std::vector<pid_t>& pids) {
  constexpr std::size_t kNamed = 5;
  std::string text;
  for (std::size_t i = 0; i < pids.size() && i < kNamed; ++i) text += (i == 0 ? "" : ", ") + describe_process(pids[i]);
  if (pids.size() > kNamed) text += " and " + std::to_string(pids.size() - kNamed) + " more";
  return text;
}

}  // namespace

JobProcessTree::JobProcessTree() {
  // 128 random bits, so no other run's (or stranger's) processes can carry the same token.
  const std::string token = random_nonce();
  // The guardian first: started while cpprun is no subreaper yet, it is not adopted back (see
  // TreeGuardian), and it needs no token of its own.
  guardian_ = std::make_unique<TreeGuardian>(std::string(kJobTokenVariable) + "=" + token);
  if (setenv(kJobTokenVariable, token.c_str(), 1) != 0) {
    throw std::system_error(errno, std::generic_category(), "cpprun: setting " + std::string(kJobTokenVariable));
  }
  if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) {
    // Kernels before 3.4. Orphans then go to init; only the guardian's token sweep is left, which
    // runs only if cpprun is killed, so say what is lost.
    std::cerr << "cpprun: warning: prctl(PR_SET_CHILD_SUBREAPER) failed (" << std::strerror(errno)
              << "): processes the workers leave behind will not be stopped when the job ends\n";
  }
}

JobProcessTree::~JobProcessTree() {
  // Normally nothing is left: each attempt stopped its leftovers. After an exception, no waiting.
  for (int round = 0; round < 100; ++round) {
    reap_exited();
    const std::vector<pid_t> left = live_children(getpid());
    if (left.empty()) break;
    for (pid_t pid : left) kill(pid, SIGKILL);
    for (pid_t pid : left) {
      int status = 0;
      while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
    }
  }
  guardian_.reset();
}

int stop_leftovers(SignalRelay& relay, std::chrono::milliseconds grace) {
  reap_exited();
  std::vector<pid_t> left = live_children(getpid());
  if (left.empty()) return 0;
  std::cerr << "cpprun: stopping " << left.size() << (left.size() == 1 ? " process" : " processes")
            << " the workers left behind: " << describe_processes(left)
            << "; SIGTERM, then SIGKILL after --shutdown_timeout\n";
  int ending = 0;
  std::set<pid_t> told;  // SIGTERM once each, also to orphans of orphans adopted meanwhile
  const auto deadline = Clock::now() + grace;
  for (;;) {
    for (pid_t pid : left) {
      if (told.insert(pid).second) kill(pid, SIGTERM);
    }
    const auto wait = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
    if (wait.count() <= 0 || ending != 0) break;
    // SIGCHLD (through the relay) says one of them exited.
    pollfd fd{relay.wake_fd(), POLLIN, 0};
    if (poll(&fd, 1, static_cast<int>(std::min<long long>(wait.count(), 1 << 30))) < 0 && errno != EINTR) {
      throw std::runtime_error(std::string("cpprun: poll() failed: ") + std::strerror(errno));
    }
    for (int sig : relay.take_pending()) {
      if (ends_job(sig) && ending == 0) ending = sig;
    }
    reap_exited();
    left = live_children(getpid());
    if (left.empty()) return ending;
  }
  // SIGKILL cannot be caught, so each wait ends as soon as the kernel has torn the process down.
  // Bounded, in case something forks faster than we kill.
  for (int round = 0; round < 100 && !left.empty(); ++round) {
    for (pid_t pid : left) kill(pid, SIGKILL);
    for (pid_t pid : left) {
      int status = 0;
      while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
    }
    reap_exited();
    left = live_children(getpid());
  }
  return ending;
}

}  // namespace cpprun::launcher
