// Reads /proc/PID/stat, /proc/PID/task/TID/children and /proc/PID/environ.
#include "workers/process_table.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <sstream>

namespace cpprun::launcher {

std::string read_proc_file(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {};
  std::string text;
  char buffer[4096];
  for (ssize_t n; (n = read(fd, buffer, sizeof(buffer))) != 0;) {
    if (n > 0) {
      text.append(buffer, static_cast<std::size_t>(n));
    } else if (errno != EINTR) {
      break;
    }
  }
  close(fd);
  return text;
}

namespace {

// Numeric names in `dir`: pids in /proc, thread ids in /proc/PID/task.
std::vector<pid_t> numeric_entries(const std::string& dir) {
  std::vector<pid_t> ids;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return ids;
  while (const dirent* entry = readdir(d)) {
    char* end = nullptr;
    const long id = std::strtol(entry->d_name, &end, 10);
    if (end != entry->d_name && *end == '\0' && id > 0) ids.push_back(static_cast<pid_t>(id));
  }
  closedir(d);
  return ids;
}

struct StatFields {
  char state = '?';
  pid_t ppid = 0;
};

// "PID (COMM) S PPID ...": COMM may hold spaces and parentheses, so read after the last ')'.
bool read_stat(pid_t pid, StatFields& fields) {
  const std::string stat = read_proc_file("/proc/" + std::to_string(pid) + "/stat");
  const auto close = stat.rfind(')');
  if (close == std::string::npos) return false;
  std::istringstream rest(stat.substr(close + 1));
  long ppid = 0;
  if (!(rest >> fields.state >> ppid)) return false;
  fields.ppid = static_cast<pid_t>(ppid);
  return true;
}

bool is_live(pid_t pid) {
  StatFields fields;
  return read_stat(pid, fields) && fields.state != 'Z' && fields.state != 'X';
}

}  // namespace

std::vector<pid_t> live_children(pid_t parent) {
  const std::string task_dir = "/proc/" + std::to_string(parent) + "/task";
  std::vector<pid_t> children;
  const std::vector<pid_t> threads = numeric_entries(task_dir);
  bool listed = !threads.empty();
  for (pid_t tid : threads) {
    const std::string path = task_dir + "/" + std::to_string(tid) + "/children";
    if (access(path.c_str(), R_OK) != 0) {
      listed = false;  // no CONFIG_PROC_CHILDREN
      break;
    }
    std::istringstream list(read_proc_file(path));
    for (long pid = 0; list >> pid;) {
      if (is_live(static_cast<pid_t>(pid))) children.push_back(static_cast<pid_t>(pid));
    }
  }
  if (listed) return children;
  children.clear();
  for (pid_t pid : numeric_entries("/proc")) {
    StatFields fields;
    if (read_stat(pid, fields) && fields.ppid == parent && fields.state != 'Z' && fields.state != 'X') {
      children.push_back(pid);
    }
  }
  return children;
}

std::vector<pid_t> processes_with_env_entry(const std::string& entry) {
  std::vector<pid_t> found;
  const std::string needle = std::string(1, '\0') + entry + '\0';
  for (pid_t pid : numeric_entries("/proc")) {
    // A leading NUL lets one search match whole entries only, the first one included.
    const std::string environ = '\0' + read_proc_file("/proc/" + std::to_string(pid) + "/environ");
    if (environ.find(needle) != std::string::npos && is_live(pid)) found.push_back(pid);
  }
  return found;
}

}  // namespace cpprun::launcher
