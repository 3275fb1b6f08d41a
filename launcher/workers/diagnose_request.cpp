// Note [Answering cpprun --diagnose]
// The request is a queued signal (sigqueue: diagnose_signal()) whose value is the number of a file
// descriptor of ours: an unlinked temp file. The running cpprun knows our pid from the signal, opens
// /proc/OUR_PID/fd/N (the kernel lets only our own user, or root, do that), writes the text, and
// signals back. No socket listens anywhere, and only who may signal cpprun can ask it.
#include "workers/diagnose_request.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include "workers/job_process_tree.h"
#include "workers/run_directory.h"
#include "workers/signal_relay.h"

namespace cpprun::launcher {
namespace {

// The executable's base name of `pid`, or "" if it cannot be read.
std::string program_of(pid_t pid) {
  char target[PATH_MAX] = {};
  const std::string link = "/proc/" + std::to_string(pid) + "/exe";
  const ssize_t n = readlink(link.c_str(), target, sizeof(target) - 1);
  if (n <= 0) return "";
  std::string path(target, static_cast<std::size_t>(n));
  const std::string deleted = " (deleted)";  // a rebuilt binary while the job runs
  if (path.size() > deleted.size() && path.compare(path.size() - deleted.size(), deleted.size(), deleted) == 0) {
    path.resize(path.size() - deleted.size());
  }
  return path.substr(path.rfind('/') + 1);
}

// A /proc/PID file's bytes ("" if it cannot be read).
std::string proc_file(pid_t pid, const char* name) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/" + name, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Whether `pid` is a cpprun's guardian (job_process_tree.h): by its process name.
bool is_guardian(pid_t pid) { return proc_file(pid, "comm") == std::string(kGuardianName) + "\n"; }

// The cpprun processes (not guardians) of this user whose command line is the guardian's: the
// guardian is a fork of its cpprun, so its own is among them; a second job started with the same
// command line is too, and then the guardian alone cannot say which is its.
std::vector<pid_t> launchers_like(pid_t guardian) {
  const std::string command_line = proc_file(guardian, "cmdline");
  std::vector<pid_t> found;
  DIR* proc = opendir("/proc");
  if (proc == nullptr || command_line.empty()) {
    if (proc != nullptr) closedir(proc);
    return found;
  }
  while (const dirent* entry = readdir(proc)) {
    char* end = nullptr;
    const long pid = std::strtol(entry->d_name, &end, 10);
    if (*end != '\0' || pid <= 0 || pid == guardian || pid == getpid()) continue;
    if (program_of(static_cast<pid_t>(pid)) != "cpprun") continue;  // another user's reads as ""
    if (is_guardian(static_cast<pid_t>(pid))) continue;
    if (proc_file(static_cast<pid_t>(pid), "cmdline") == command_line) found.push_back(static_cast<pid_t>(pid));
  }
  closedir(proc);
  return found;
}

int temp_file() {
  const std::string where = temp_root();  // the job's own temp dir's choice, as Python's tempfile
  int fd = open(where.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd >= 0) return fd;
  std::string pattern = where + "/cpprun-diagnose-XXXXXX";
  fd = mkostemp(pattern.data(), O_CLOEXEC);
  if (fd >= 0) unlink(pattern.c_str());
  return fd;
}

}  // namespace

int request_diagnosis(const std::string& pid_text, std::chrono::milliseconds timeout) {
  char* end = nullptr;
  errno = 0;
  long pid = std::strtol(pid_text.c_str(), &end, 10);
  if (pid_text.empty() || *end != '\0' || errno != 0 || pid <= 0 || pid > INT_MAX) {
    std::cerr << "cpprun: --diagnose needs the process id of a running cpprun (e.g. cpprun --diagnose 4242; "
                 "pgrep -a cpprun lists them), got '" << pid_text << "'\n";
    return 2;
  }
  const std::string program = program_of(static_cast<pid_t>(pid));
  if (program != "cpprun") {
    std::cerr << "cpprun: --diagnose " << pid << ": "
              << (program.empty() ? "no process with that id is yours to ask" : "that process is " + program + ", not cpprun")
              << " (pgrep -a cpprun lists the running ones)\n";
    return 2;
  }
  // Note [The guardian relays the launcher's signals]: the guardian keeps cpprun's command line, so
  // `pgrep -a cpprun` lists both and `pgrep -nf` names the guardian. It knows no ranks: ask its cpprun.
  if (is_guardian(static_cast<pid_t>(pid))) {
    const std::vector<pid_t> launchers = launchers_like(static_cast<pid_t>(pid));
    if (launchers.size() != 1) {
      std::cerr << "cpprun: --diagnose " << pid << ": that process is the guardian of a cpprun (" << kGuardianName
                << ", which kills what a job leaves if its cpprun dies), and it knows no ranks; ";
      if (launchers.empty()) {
        std::cerr << "no cpprun with its command line runs (pgrep -a cpprun lists the running ones)\n";
      } else {
        std::cerr << "cpprun";
        for (pid_t launcher : launchers) std::cerr << " " << launcher;
        std::cerr << " run with its command line: give one of them (ps -o pid,comm,args tells the guardians apart)\n";
      }
      return 2;
    }
    std::cerr << "cpprun: --diagnose " << pid << ": that process is the guardian of cpprun " << launchers[0]
              << " (" << kGuardianName << ", with its command line); asking " << launchers[0] << "\n";
    pid = launchers[0];
  }
  const int sig = diagnose_signal();
  sigset_t wait_for;
  sigemptyset(&wait_for);
  sigaddset(&wait_for, sig);
  sigprocmask(SIG_BLOCK, &wait_for, nullptr);  // from now on the answer waits for sigtimedwait()
  const int reply = temp_file();
  if (reply < 0) {
    std::cerr << "cpprun: --diagnose: cannot make a temp file for the answer: " << std::strerror(errno)
              << " (set TMPDIR)\n";
    return 1;
  }
  union sigval value {};
  value.sival_int = reply;
  if (sigqueue(static_cast<pid_t>(pid), sig, value) != 0) {
    std::cerr << "cpprun: --diagnose " << pid << ": cannot signal it: " << std::strerror(errno) << "\n";
    return 2;
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      std::cerr << "cpprun: --diagnose " << pid << ": no answer within "
                << std::chrono::duration_cast<std::chrono::seconds>(timeout).count()
                << " s; a cpprun answers while its workers run or it waits to restart them (not while it "
                   "waits for other nodes)\n";
      return 1;
    }
    const timespec wait{static_cast<time_t>(left.count() / 1000), static_cast<long>(left.count() % 1000) * 1000000L};
    siginfo_t info{};
    if (sigtimedwait(&wait_for, &info, &wait) == sig && info.si_pid == static_cast<pid_t>(pid)) break;
  }
  std::string text;
  char buffer[8192];
  for (off_t offset = 0;;) {
    const ssize_t n = pread(reply, buffer, sizeof(buffer), offset);
    if (n <= 0) break;
    text.append(buffer, static_cast<std::size_t>(n));
    offset += n;
  }
  close(reply);
  std::cout << text << std::flush;
  return 0;
}

}  // namespace cpprun::launcher
