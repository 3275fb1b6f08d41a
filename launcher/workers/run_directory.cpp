// Creating and removing the run directory; reading back a worker's error file.
#include "workers/run_directory.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <system_error>
#include <vector>

#include "command_line/output_spec.h"  // kNullLogDir
#include "workers/stale_run_dirs.h"

namespace cpprun::launcher {
namespace {

// mkdir -p. Existing directories are fine.
void make_directories(const std::string& path, const std::string& what) {
  std::error_code error;
  std::filesystem::create_directories(path, error);
  if (!error && !std::filesystem::is_directory(path, error)) error = std::make_error_code(std::errc::not_a_directory);
  if (error) throw std::system_error(error, "cpprun: " + what + ": cannot create " + path);
}

// `prefix` + 8 characters of Python's mkdtemp alphabet, made with mkdir (which fails if it exists).
std::string make_unique_dir(const std::string& prefix, const std::string& what) {
  static const char kAlphabet[] = "abcdefghijklmnopqrstuvwxyz0123456789_";
  const int urandom = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (urandom < 0) throw std::system_error(errno, std::generic_category(), "cpprun: " + what + ": /dev/urandom");
  for (int tries = 0; tries < 100; ++tries) {
    unsigned char bytes[8];
    if (read(urandom, bytes, sizeof(bytes)) != static_cast<ssize_t>(sizeof(bytes))) break;
    std::string path = prefix;
    for (unsigned char b : bytes) path += kAlphabet[b % (sizeof(kAlphabet) - 1)];
    if (mkdir(path.c_str(), 0700) == 0) {
      close(urandom);
      return path;
    }
    if (errno != EEXIST) {
      const int err = errno;
      close(urandom);
      throw std::system_error(err, std::generic_category(), "cpprun: " + what + ": cannot create " + path);
    }
  }
  const int err = errno;
  close(urandom);
  throw std::system_error(err, std::generic_category(), "cpprun: " + what + ": cannot create " + prefix + "XXXXXXXX");
}

}  // namespace

std::string temp_root() {
  std::vector<std::string> candidates;
  for (const char* name : {"TMPDIR", "TEMP", "TMP"}) {
    const char* value = std::getenv(name);
    if (value != nullptr && *value != '\0') candidates.emplace_back(value);
  }
  for (const char* dir : {"/tmp", "/var/tmp", "/usr/tmp"}) candidates.emplace_back(dir);
  for (const std::string& dir : candidates) {
    struct stat st {};
    if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || ::access(dir.c_str(), W_OK | X_OK) != 0) continue;
    if (dir.front() == '/') return dir;
    // A relative TMPDIR made absolute, as Python's gettempdir() makes it (os.path.abspath): the paths
    // under it reach workers that may change directory.
    std::error_code error;
    std::string absolute = std::filesystem::absolute(dir, error).lexically_normal().string();
    if (error) return dir;
    if (absolute.size() > 1 && absolute.back() == '/') absolute.pop_back();
    return absolute;
  }
  std::error_code error;
  const std::string here = std::filesystem::current_path(error).string();
  return error ? std::string("/tmp") : here;  // nothing writable anywhere: the error names /tmp
}

std::string RunLayout::worker_dir(int attempt, int local_rank) const {
  return dir + "/attempt_" + std::to_string(attempt) + "/" + std::to_string(local_rank);
}

std::string RunLayout::error_file(int attempt, int local_rank) const {
  if (!error_files) return "";
  if (per_worker_dirs) return worker_dir(attempt, local_rank) + "/error.json";
  return dir + "/attempt_" + std::to_string(attempt) + "." + std::to_string(local_rank) + ".error.json";
}

std::string RunLayout::run_path_finished_file(int attempt) const {
  return (private_dir.empty() ? dir : private_dir) + "/attempt_" + std::to_string(attempt) + ".run_path_finished";
}

std::string RunLayout::flight_recorder_dir(int attempt) const {
  return absolute_attempt_file(attempt, "flight_recorder");
}

std::string RunLayout::nccl_trace_dir(int attempt) const {
  return absolute_attempt_file(attempt, "nccl_flight_recorder");
}

std::string RunLayout::absolute_attempt_file(int attempt, const std::string& name) const {
  const std::string base = start_dir.empty() || dir.rfind('/', 0) == 0 ? dir : start_dir + "/" + dir;
  return base + "/attempt_" + std::to_string(attempt) + (per_worker_dirs ? "/" : ".") + name;
}

std::string RunLayout::diagnosis_file(int attempt) const {
  return per_worker_dirs ? dir + "/attempt_" + std::to_string(attempt) + "/diagnosis.json" : "";
}

RunLayout RunLayout::planned(const std::string& log_dir, const std::string& run_id, bool writes_files) {
  const std::string private_dir = temp_root() + "/cpprun-XXXXXX";
  if (log_dir == kNullLogDir) return {private_dir, false, private_dir, false};
  if (!log_dir.empty()) {
    // Read once, here: cpprun never changes directory, its workers may. (A working directory that is
    // gone leaves the dump dirs relative, as they were.)
    std::error_code error;
    const std::string here = log_dir.front() == '/' ? "" : std::filesystem::current_path(error).string();
    const std::string start_dir = error ? "" : here;
    return {log_dir + "/" + run_id + "_XXXXXXXX", true, private_dir, true, start_dir};
  }
  if (writes_files) return {temp_root() + "/torchelastic_XXXXXX/" + run_id + "_XXXXXXXX", true, private_dir};
  return {private_dir, false, private_dir};
}

RunDirectory::RunDirectory(const std::string& log_dir, const std::string& run_id, bool writes_files,
                           bool private_files)
    : layout_(RunLayout::planned(log_dir, run_id, writes_files)) {
  if (layout_.per_worker_dirs) {
    // Only a job with files of cpprun's own (--run_path's barrier) needs a writable TMPDIR beside
    // a log dir, as torchrun's --log_dir touches none; made first, so that a failure leaves no
    // empty run dir in the log dir.
    if (private_files) {
      removed_stale_ = remove_stale_run_dirs(temp_root());  // Note [Stale temp dirs]
      std::string own = layout_.private_dir;
      if (mkdtemp(own.data()) == nullptr) {
        throw std::system_error(errno, std::generic_category(),
                                "cpprun: cannot create the run's temp dir " + layout_.private_dir + " (set TMPDIR)");
      }
      layout_.private_dir = own;
      record_owner(own);
    } else {
      layout_.private_dir.clear();
    }
    std::string base = log_dir;
    if (base.empty()) {
      base = temp_root() + "/torchelastic_XXXXXX";
      if (mkdtemp(base.data()) == nullptr) {
        throw std::system_error(errno, std::generic_category(),
                                "cpprun: cannot create a log dir " + base + " for --redirects/--tee (set TMPDIR or "
                                "--log_dir)");
      }
      made_log_dir_ = base;
    } else {
      make_directories(log_dir, "--log_dir=" + log_dir);
    }
    layout_.dir = make_unique_dir(base + "/" + run_id + "_", "--log_dir=" + base);
    return;
  }
  removed_stale_ = remove_stale_run_dirs(temp_root());  // Note [Stale temp dirs]
  std::string dir = layout_.dir;
  if (mkdtemp(dir.data()) == nullptr) {
    throw std::system_error(errno, std::generic_category(),
                            "cpprun: cannot create the run's temp dir " + layout_.dir + " (set TMPDIR or --log_dir)");
  }
  layout_.dir = dir;  // See Note [Flat temp dir]
  layout_.private_dir = dir;
  record_owner(dir);
}

RunDirectory::~RunDirectory() {
  // Best effort; a symlink a worker left is removed, not followed.
  std::error_code ignored;
  if (layout_.per_worker_dirs) {
    if (!layout_.private_dir.empty()) std::filesystem::remove_all(layout_.private_dir, ignored);
    return;
  }
  // PyTorch's NCCL dumps are the one thing here a person reads after the job: the diagnosis named them.
  namespace fs = std::filesystem;
  std::vector<fs::path> entries;  // all read before any is removed
  std::error_code listing;
  for (fs::directory_iterator it(layout_.dir, listing), end; !listing && it != end; it.increment(listing)) {
    entries.push_back(it->path());
  }
  if (listing) {  // cannot tell what is in it: as before, all of it goes
    fs::remove_all(layout_.dir, ignored);
    return;
  }
  const std::string kept = ".nccl_flight_recorder";
  for (const fs::path& entry : entries) {
    const std::string name = entry.filename().string();
    std::error_code error;
    const bool nccl_dumps = name.size() > kept.size() &&
                            name.compare(name.size() - kept.size(), kept.size(), kept) == 0 &&
                            fs::is_directory(fs::symlink_status(entry, error)) && !fs::is_empty(entry, error) && !error;
    if (!nccl_dumps) fs::remove_all(entry, ignored);
  }
  fs::remove(layout_.dir, ignored);  // only if nothing was kept
}

void RunDirectory::prepare_attempt(int attempt, int nproc_per_node, const std::vector<std::string>& filtered_logs) const {
  // torchrun starts each attempt's filtered_std{out,err}.log afresh (c10d's rounds reuse attempt_N).
  if (layout_.per_worker_dirs) {
    for (const char* name : {"filtered_stdout.log", "filtered_stderr.log"}) {
      const std::string path = layout_.dir + "/attempt_" + std::to_string(attempt) + "/" + name;
      if (unlink(path.c_str()) != 0 && errno != ENOENT) {
        throw std::system_error(errno, std::generic_category(), "cpprun: cannot remove the stale " + path);
      }
    }
  }
  for (int local_rank = 0; local_rank < nproc_per_node; ++local_rank) {
    // The temp dir too: a c10d membership change runs the same attempt number again.
    if (layout_.per_worker_dirs) make_directories(layout_.worker_dir(attempt, local_rank), "--log_dir=" + layout_.dir);
    const std::string error_file = layout_.error_file(attempt, local_rank);
    if (!error_file.empty() && unlink(error_file.c_str()) != 0 && errno != ENOENT) {
      throw std::system_error(errno, std::generic_category(), "cpprun: cannot remove the stale " + error_file);
    }
  }
  // torchrun's PContext opens each asked-for filtered log (mode "w") when the attempt starts.
  if (layout_.per_worker_dirs) {
    for (const std::string& name : filtered_logs) {
      const std::string path = layout_.dir + "/attempt_" + std::to_string(attempt) + "/" + name;
      const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
      if (fd < 0) throw std::system_error(errno, std::generic_category(), "cpprun: cannot create " + path);
      close(fd);
    }
  }
  // A barrier a killed attempt left half counted (c10d's rounds reuse attempt_N).
  const std::string finished = layout_.run_path_finished_file(attempt);
  if (unlink(finished.c_str()) != 0 && errno != ENOENT) {
    throw std::system_error(errno, std::generic_category(), "cpprun: cannot remove the stale " + finished);
  }
  // Made by the first worker that records collectives, so that a job of programs that do not (a
  // torch.distributed one) leaves exactly torchrun's --log_dir tree.
  // PyTorch's NCCL dump dir likewise; run_attempt makes it for the workers that get its prefix.
  for (const std::string& dumps : {layout_.flight_recorder_dir(attempt), layout_.nccl_trace_dir(attempt)}) {
    std::error_code error;
    std::filesystem::remove_all(dumps, error);
    if (error) throw std::system_error(error, "cpprun: cannot remove the stale " + dumps);
  }
}

std::optional<std::string> read_file_head(const std::string& path, std::size_t limit) {
  // The workers write these files: a FIFO or a device there must not block or flood the launcher.
  const int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  struct stat info {};
  if (fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    close(fd);
    return std::nullopt;
  }
  std::string text(limit + 1, '\0');
  std::size_t got = 0;
  while (got < text.size()) {
    const ssize_t n = read(fd, text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<std::size_t>(n);
  }
  close(fd);
  text.resize(std::min(got, limit));
  if (got > limit) text += "\n[... cut at " + std::to_string(limit) + " bytes]";
  return text;
}

}  // namespace cpprun::launcher
