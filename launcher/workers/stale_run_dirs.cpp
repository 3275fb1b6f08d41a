// Note [Stale temp dirs]
// A cpprun that is SIGKILLed cannot remove its ${TMPDIR:-/tmp}/cpprun-XXXXXX (error files, --run_path's
// barrier); its guardian stops its processes but knows nothing of files. So each such dir holds a
// record of its owner (RunDirOwner), and every cpprun, before making its own, removes the ones whose
// owner is certainly gone. What makes that safe:
// - only names cpprun-XXXXXX (mkdtemp's 6 characters) directly in the temp root, that lstat() shows a
//   directory (a symlink is never followed nor removed) owned by this uid: another user's, or
//   anything else, is never touched;
// - only with a record: a dir cpprun keeps on purpose (PyTorch's NCCL dumps the diagnosis named) has
//   none, as its owner removes the record with everything else when it exits normally;
// - "gone" needs the same machine and boot (boot_id: a TMPDIR on NFS is shared between hosts), the
//   same pid namespace (a container sharing /tmp sees other pids), and the pid free or now another
//   process's (its start time differs): a live owner is never taken for a dead one. A record that
//   cannot be read or parsed keeps its dir.
// The record is read through a descriptor of the dir opened with O_NOFOLLOW|O_DIRECTORY, and the
// dir is removed by path with std::filesystem::remove_all, which removes symlinks inside without
// following them; the dir is mode 0700 and in a sticky /tmp only this uid can swap it meanwhile.
#include "workers/stale_run_dirs.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <filesystem>
#include <sstream>

namespace cpprun::launcher {
namespace {

constexpr const char* kRecordHeader = "cpprun run dir owner v1";

// Up to 4 KiB of an open file; "" if unreadable.
std::string read_small(int fd) {
  std::string text;
  char buffer[4096];
  for (;;) {
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buffer, static_cast<std::size_t>(n));
    if (text.size() > sizeof(buffer)) return "";
  }
  return text;
}

std::string read_small_file(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  std::string text = read_small(fd);
  close(fd);
  return text;
}

std::optional<unsigned long long> proc_start_time(pid_t pid) {
  const std::string stat = read_small_file("/proc/" + std::to_string(pid) + "/stat");
  const auto close_paren = stat.rfind(')');
  if (close_paren == std::string::npos) return std::nullopt;
  // After "pid (comm)": state is field 3, starttime field 22.
  std::istringstream rest(stat.substr(close_paren + 1));
  std::string field;
  for (int index = 3; index < 22; ++index) {
    if (!(rest >> field)) return std::nullopt;
  }
  unsigned long long start = 0;
  if (!(rest >> start)) return std::nullopt;
  return start;
}

// "cpprun-" and 6 characters of mkdtemp's alphabet.
bool run_dir_name(const std::string& name) {
  const std::string prefix = "cpprun-";
  if (name.size() != prefix.size() + 6 || name.compare(0, prefix.size(), prefix) != 0) return false;
  for (std::size_t i = prefix.size(); i < name.size(); ++i) {
    if (std::isalnum(static_cast<unsigned char>(name[i])) == 0) return false;
  }
  return true;
}

}  // namespace

std::string format_owner(const RunDirOwner& owner) {
  return std::string(kRecordHeader) + "\nboot_id " + owner.boot_id + "\npid_namespace " + owner.pid_namespace +
         "\npid " + std::to_string(owner.pid) + "\nstart_time " + std::to_string(owner.start_time) + "\n";
}

std::optional<RunDirOwner> parse_owner(const std::string& text) {
  // Every line ends in '\n': a record cut short (SIGKILL while writing) is not read, even in a number.
  if (text.empty() || text.back() != '\n') return std::nullopt;
  std::istringstream lines(text);
  std::string line;
  if (!std::getline(lines, line) || line != kRecordHeader) return std::nullopt;
  RunDirOwner owner;
  int seen = 0;
  while (std::getline(lines, line)) {
    const auto space = line.find(' ');
    if (space == std::string::npos) return std::nullopt;
    const std::string key = line.substr(0, space);
    const std::string value = line.substr(space + 1);
    if (value.empty()) return std::nullopt;
    try {
      std::size_t used = 0;
      if (key == "boot_id") {
        owner.boot_id = value;
      } else if (key == "pid_namespace") {
        owner.pid_namespace = value;
      } else if (key == "pid") {
        const long pid = std::stol(value, &used);
        if (used != value.size() || pid <= 0) return std::nullopt;
        owner.pid = static_cast<pid_t>(pid);
      } else if (key == "start_time") {
        owner.start_time = std::stoull(value, &used);
        if (used != value.size() || value.front() == '-') return std::nullopt;
      } else {
        return std::nullopt;
      }
    } catch (const std::exception&) {
      return std::nullopt;
    }
    ++seen;
  }
  // Every field once.
  if (seen != 4 || owner.boot_id.empty() || owner.pid_namespace.empty() || owner.pid == 0) return std::nullopt;
  return owner;
}

bool owner_gone(const RunDirOwner& recorded, const RunDirOwner& self,
                const std::function<std::optional<unsigned long long>(pid_t)>& start_time_of) {
  if (recorded.boot_id != self.boot_id || recorded.pid_namespace != self.pid_namespace) return false;
  if (recorded.pid == self.pid && recorded.start_time == self.start_time) return false;
  const std::optional<unsigned long long> now = start_time_of(recorded.pid);
  return !now || *now != recorded.start_time;
}

std::optional<RunDirOwner> this_process_owner() {
  RunDirOwner owner;
  owner.boot_id = read_small_file("/proc/sys/kernel/random/boot_id");
  while (!owner.boot_id.empty() && std::isspace(static_cast<unsigned char>(owner.boot_id.back())) != 0) {
    owner.boot_id.pop_back();
  }
  char ns[256];
  const ssize_t length = readlink("/proc/self/ns/pid", ns, sizeof(ns) - 1);
  if (length > 0) owner.pid_namespace.assign(ns, static_cast<std::size_t>(length));
  owner.pid = getpid();
  // /proc may be another pid namespace's (unshare -pf without --mount-proc): there /proc/PID is
  // another process, whose start time would stand for ours. Then nothing is recorded or swept.
  char self[32];
  const ssize_t self_length = readlink("/proc/self", self, sizeof(self) - 1);
  if (self_length <= 0 || std::string(self, static_cast<std::size_t>(self_length)) != std::to_string(owner.pid)) {
    return std::nullopt;
  }
  const std::optional<unsigned long long> start = proc_start_time(owner.pid);
  if (owner.boot_id.empty() || owner.pid_namespace.empty() || !start) return std::nullopt;
  owner.start_time = *start;
  // Values with a space or a line break would not read back: treated as unknown.
  for (const std::string* value : {&owner.boot_id, &owner.pid_namespace}) {
    if (value->find_first_of(" \n") != std::string::npos) return std::nullopt;
  }
  return owner;
}

void record_owner(const std::string& dir) {
  const std::optional<RunDirOwner> owner = this_process_owner();
  if (!owner) return;
  const std::string text = format_owner(*owner);
  const int fd = open((dir + "/" + kOwnerRecord).c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return;
  [[maybe_unused]] const ssize_t n = write(fd, text.data(), text.size());  // short: parse_owner refuses it
  close(fd);
}

std::vector<std::string> remove_stale_run_dirs(const std::string& root) {
  std::vector<std::string> removed;
  const std::optional<RunDirOwner> self = this_process_owner();
  if (!self) return removed;
  DIR* listing = opendir(root.c_str());
  if (listing == nullptr) return removed;
  std::vector<std::string> candidates;
  while (const dirent* entry = readdir(listing)) {
    if (run_dir_name(entry->d_name)) candidates.emplace_back(entry->d_name);
  }
  const int root_fd = dirfd(listing);
  for (const std::string& name : candidates) {
    struct stat info {};
    if (fstatat(root_fd, name.c_str(), &info, AT_SYMLINK_NOFOLLOW) != 0) continue;
    if (!S_ISDIR(info.st_mode) || info.st_uid != geteuid()) continue;
    const int dir_fd = openat(root_fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dir_fd < 0) continue;
    struct stat opened {};
    const bool same = fstat(dir_fd, &opened) == 0 && opened.st_dev == info.st_dev && opened.st_ino == info.st_ino;
    const int record_fd = same ? openat(dir_fd, kOwnerRecord, O_RDONLY | O_NOFOLLOW | O_CLOEXEC) : -1;
    close(dir_fd);
    if (record_fd < 0) continue;
    const std::optional<RunDirOwner> owner = parse_owner(read_small(record_fd));
    close(record_fd);
    if (!owner || !owner_gone(*owner, *self, proc_start_time)) continue;
    const std::string path = root + "/" + name;
    std::error_code ignored;
    if (std::filesystem::remove_all(path, ignored) != static_cast<std::uintmax_t>(-1) && !std::filesystem::exists(std::filesystem::symlink_status(path, ignored))) {
      removed.push_back(path);
    }
  }
  closedir(listing);
  return removed;
}

}  // namespace cpprun::launcher
