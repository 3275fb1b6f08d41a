// fork + exec of one worker, with the exec's outcome reported back over a close-on-exec pipe.
#include "workers/worker_process.h"

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#if __has_include(<linux/close_range.h>)
#include <linux/close_range.h>
#endif

#include <cerrno>
#include <cstdint>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <iostream>

#include "workers/open_file_limit.h"

namespace cpprun::launcher {
namespace {

// What the child sends back when a step before the exec, or the exec, fails. `step` points at a
// string literal, which has the same address in the parent: fork() copied the address space.
struct ChildFailure {
  const char* step;
  int error;
};

std::vector<char*> as_c_strings(const std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  pointers.reserve(strings.size() + 1);
  for (const std::string& s : strings) pointers.push_back(const_cast<char*>(s.c_str()));
  pointers.push_back(nullptr);
  return pointers;
}

[[noreturn]] void fail_in_child(int report_fd, const char* step) {
  const ChildFailure failure{step, errno};
  [[maybe_unused]] const ssize_t n = write(report_fd, &failure, sizeof(failure));
  _exit(127);
}

// Makes `fd` the child's `target` (0, 1 or 2) without close-on-exec. main() keeps 0-2 open, so the
// pipe ends are never 1 or 2 themselves and the first dup2() cannot clobber the second's source.
bool install_stdio(int fd, int target) {
  return fd < 0 || retry_on_eintr([&] { return dup2(fd, target); }) == target;
}

}  // namespace

bool mark_listed_descriptors_cloexec(int first) noexcept {
  const int listing = open("/proc/self/fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (listing < 0) return false;
  struct LinuxDirent64 {  // the kernel's linux_dirent64, which no libc header declares
    uint64_t d_ino;
    int64_t d_off;
    unsigned short d_reclen;
    unsigned char d_type;
    char d_name[1];
  };
  alignas(8) char entries[4096];
  for (;;) {
    const long got = syscall(SYS_getdents64, listing, entries, sizeof(entries));
    if (got <= 0) break;
    for (long at = 0; at < got;) {
      const auto* entry = reinterpret_cast<const LinuxDirent64*>(entries + at);
      at += entry->d_reclen;
      const char* c = entry->d_name;
      if (*c < '0' || *c > '9') continue;  // "." and ".."
      int fd = 0;
      for (; *c >= '0' && *c <= '9'; ++c) fd = fd * 10 + (*c - '0');
      if (fd >= first && fd != listing) fcntl(fd, F_SETFD, FD_CLOEXEC);
    }
  }
  close(listing);
  return true;
}

namespace {

// Note [Descriptors a worker inherits]
// A worker gets stdin, stdout, stderr and the flight recorder's request descriptor, nothing else
// of the launcher's, as torchrun's (Python's subprocess closes the rest): a descriptor cpprun's
// caller left open (a pipe it waits on for EOF, a lock file) must not live on in the workers and
// their children. Every other descriptor is made close-on-exec, one call on Linux 5.11 on; before
// it, one fcntl() for each descriptor /proc/self/fd lists (read with raw getdents64: opendir would
// allocate), or one a descriptor up to the limit without /proc: the launcher raises its own limit
// (workers/open_file_limit.h), up to 2^20, too many to try one by one for each worker.
// Async-signal-safe.
void close_on_exec_from(int first) noexcept {
#ifdef CLOSE_RANGE_CLOEXEC
  if (syscall(SYS_close_range, static_cast<unsigned>(first), ~0U, CLOSE_RANGE_CLOEXEC) == 0) return;
#endif
  if (mark_listed_descriptors_cloexec(first)) return;
  struct rlimit limit {};
  rlim_t last = 65536;
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) last = limit.rlim_cur;
  if (last > (rlim_t{1} << 20)) last = rlim_t{1} << 20;
  for (rlim_t fd = static_cast<rlim_t>(first); fd < last; ++fd) fcntl(static_cast<int>(fd), F_SETFD, FD_CLOEXEC);
}

[[noreturn]] void run_child(const SignalRelay& relay, pid_t launcher_pid, int report_fd, ChildStdio stdio,
                            const char* path, char* const* argv, char* const* envp) {
  relay.restore_in_child();
  if (!install_stdio(stdio.in, STDIN_FILENO) || !install_stdio(stdio.out, STDOUT_FILENO) ||
      !install_stdio(stdio.err, STDERR_FILENO)) {
    fail_in_child(report_fd, "dup2() of stdin/stdout/stderr");
  }
  if (stdio.extra >= 0) {
    // The report pipe must survive until exec: move it off the target first.
    if (report_fd == stdio.extra_target) {
      report_fd = fcntl(report_fd, F_DUPFD_CLOEXEC, stdio.extra_target + 1);
      if (report_fd < 0) _exit(127);
    }
    // dup2() onto itself would keep close-on-exec, so that case clears the flag instead.
    const bool installed = stdio.extra == stdio.extra_target
                               ? fcntl(stdio.extra, F_SETFD, 0) == 0
                               : retry_on_eintr([&] { return dup2(stdio.extra, stdio.extra_target); }) ==
                                     stdio.extra_target;
    if (!installed) fail_in_child(report_fd, "dup2() of the inherited descriptor");
  }
  close_on_exec_from(STDERR_FILENO + 1);  // Note [Descriptors a worker inherits]
  restore_open_file_limit_in_child();     // after the loop above, which the raised limit bounds
  if (stdio.extra >= 0 && fcntl(stdio.extra_target, F_SETFD, 0) != 0) {
    fail_in_child(report_fd, "fcntl() of the inherited descriptor");
  }
  if (setsid() < 0) fail_in_child(report_fd, "setsid()");  // See Note [Worker sessions]
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) fail_in_child(report_fd, "prctl(PR_SET_PDEATHSIG)");
  // The launcher may have died before prctl() took effect; then nobody would ever kill us.
  if (getppid() != launcher_pid) _exit(127);
  execve(path, argv, envp);
  fail_in_child(report_fd, "execve()");
}

}  // namespace

int SpawnError::exit_code() const {
  if (error_ == ENOENT) return 127;
  if (error_ == EACCES || error_ == ENOEXEC || error_ == EISDIR) return 126;
  return 1;
}

pid_t spawn_worker(const WorkerCommand& command, const ChildStdio& stdio, const SignalRelay& relay) {
  std::vector<char*> argv = as_c_strings(command.argv);
  std::vector<char*> envp = as_c_strings(command.env);
  int report[2];
  if (pipe2(report, O_CLOEXEC) != 0) {
    const int error = errno;
    throw SpawnError(std::string("cpprun: pipe2() failed: ") + std::strerror(error) + open_file_limit_hint(error),
                     error);
  }
  const pid_t launcher_pid = getpid();
  // All signals blocked across fork(), so no handler runs in the child before restore_in_child():
  // it would write to the launcher's wake pipe, which the child shares.
  sigset_t all;
  sigset_t saved;
  sigfillset(&all);
  sigprocmask(SIG_BLOCK, &all, &saved);
  const pid_t pid = fork();
  const int fork_errno = errno;
  if (pid == 0) {
    close(report[0]);
    run_child(relay, launcher_pid, report[1], stdio, command.path.c_str(), argv.data(), envp.data());
  }
  sigprocmask(SIG_SETMASK, &saved, nullptr);
  close(report[1]);
  if (pid < 0) {
    close(report[0]);
    throw SpawnError(std::string("cpprun: fork() failed: ") + std::strerror(fork_errno), fork_errno);
  }
  // EOF means the exec happened (the pipe is close-on-exec); a record means it did not.
  ChildFailure failure{};
  const ssize_t got = retry_on_eintr([&] { return read(report[0], &failure, sizeof(failure)); });
  close(report[0]);
  if (got == 0) return pid;
  wait_for_exit(pid);
  if (got != static_cast<ssize_t>(sizeof(failure))) {
    throw SpawnError("cpprun: the worker process for '" + command.path + "' died before exec", EIO);
  }
  std::string why = std::string(failure.step) + " failed: " + std::strerror(failure.error);
  struct stat st {};
  if (failure.error == ENOENT && stat(command.path.c_str(), &st) == 0) {
    // resolve_program() checked the #! line; this is what it cannot see (or a file changed since).
    why += " (the file is there: what is missing is the interpreter its #! line names, or for a binary its "
           "dynamic loader)";
  }
  if (failure.error == ENOEXEC) {
    // torchrun runs any PROGRAM with python unless --no-python; cpprun only PROGRAM.py and the like.
    why += " (it is neither a binary for this machine nor a script with a #! line: a Python script without "
           "the .py ending? Run `cpprun ... python3 " + command.path + " ...`, name it .py, or give it a "
           "#!/usr/bin/env python3 line)";
  }
  throw SpawnError("cpprun: cannot start '" + command.path + "': " + why, failure.error);
}

void signal_process_group(pid_t pgid, int sig) {
  // Not an exception: the caller is usually stopping workers and must go on to the next group.
  if (kill(-pgid, sig) != 0 && errno != ESRCH) {
    const int error = errno;  // before the message's own writes
    std::cerr << "cpprun: warning: could not send signal " << sig << " to process group " << pgid << ": "
              << std::strerror(error) << "\n";
  }
}

pid_t wait_for_exit(pid_t pid, int* status, int flags) {
  return retry_on_eintr([&] { return waitpid(pid, status, flags); });
}

}  // namespace cpprun::launcher
