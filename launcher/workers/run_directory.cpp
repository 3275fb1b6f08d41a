// Creating and removing the run directory; reading back a worker's error file.
#include "workers/run_directory.h"

#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <system_error>
#include <vector>

namespace cpprun::launcher {
namespace {

// One level, its parent already there.
void make_directory(const std::string& path, const std::string& what) {
  if (mkdir(path.c_str(), 0777) != 0 && errno != EEXIST) {
    throw std::system_error(errno, std::generic_category(), "cpprun: " + what + ": cannot create " + path);
  }
}

// mkdir -p. Existing directories are fine.
void make_directories(const std::string& path, const std::string& what) {
  for (std::string::size_type slash = path.find('/', 1);; slash = path.find('/', slash + 1)) {
    make_directory(path.substr(0, slash), what);
    if (slash == std::string::npos) break;
  }
  struct stat info {};
  if (stat(path.c_str(), &info) != 0 || !S_ISDIR(info.st_mode)) {
    throw std::system_error(ENOTDIR, std::generic_category(), "cpprun: " + what + ": " + path);
  }
}

int remove_entry(const char* path, const struct stat*, int, FTW*) {
  remove(path);  // best effort: a file a worker still holds open goes anyway
  return 0;
}

}  // namespace

std::string RunLayout::worker_dir(int attempt, int local_rank) const {
  return dir + "/attempt_" + std::to_string(attempt) + "/" + std::to_string(local_rank);
}

std::string RunLayout::error_file(int attempt, int local_rank) const {
  if (per_worker_dirs) return worker_dir(attempt, local_rank) + "/error.json";
  return dir + "/attempt_" + std::to_string(attempt) + "." + std::to_string(local_rank) + ".error.json";
}

RunLayout RunLayout::planned(const std::string& log_dir) {
  if (!log_dir.empty()) return {log_dir, true};
  const char* tmpdir = std::getenv("TMPDIR");
  return {std::string(tmpdir != nullptr && *tmpdir != '\0' ? tmpdir : "/tmp") + "/cpprun-XXXXXX", false};
}

RunDirectory::RunDirectory(const std::string& log_dir) : layout_(RunLayout::planned(log_dir)) {
  if (layout_.per_worker_dirs) {
    make_directories(log_dir, "--log_dir=" + log_dir);
    return;
  }
  std::vector<char> buffer(layout_.dir.begin(), layout_.dir.end());
  buffer.push_back('\0');
  if (mkdtemp(buffer.data()) == nullptr) {
    throw std::system_error(errno, std::generic_category(),
                            "cpprun: cannot create the run's temp dir " + layout_.dir + " (set TMPDIR or --log_dir)");
  }
  layout_.dir = buffer.data();  // See Note [Flat temp dir]
}

RunDirectory::~RunDirectory() {
  if (layout_.per_worker_dirs) return;
  // Usually no worker wrote an error file and one rmdir does it. Otherwise FTW_DEPTH: contents
  // before their directory; FTW_PHYS: a symlink a worker left is not followed.
  if (rmdir(layout_.dir.c_str()) != 0) nftw(layout_.dir.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

void RunDirectory::prepare_attempt(int attempt, int nproc_per_node) const {
  const std::string what = "--log_dir=" + layout_.dir;
  if (layout_.per_worker_dirs) make_directory(layout_.dir + "/attempt_" + std::to_string(attempt), what);
  for (int local_rank = 0; local_rank < nproc_per_node; ++local_rank) {
    // The temp dir too: a c10d membership change runs the same attempt number again.
    if (layout_.per_worker_dirs) make_directory(layout_.worker_dir(attempt, local_rank), what);
    const std::string error_file = layout_.error_file(attempt, local_rank);
    if (unlink(error_file.c_str()) != 0 && errno != ENOENT) {
      throw std::system_error(errno, std::generic_category(), "cpprun: cannot remove the stale " + error_file);
    }
  }
}

std::optional<std::string> read_file_head(const std::string& path, std::size_t limit) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::string text(limit + 1, '\0');
  std::size_t got = 0;
  while (got < text.size()) {
    const ssize_t n = read(fd, &text[got], text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<std::size_t>(n);
  }
  close(fd);
  const bool cut = got > limit;
  text.resize(cut ? limit : got);
  if (cut) text += "\n[... cut at " + std::to_string(limit) + " bytes]";
  return text;
}

}  // namespace cpprun::launcher
