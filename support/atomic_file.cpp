// See cpprun/atomic_file.h.
#include "cpprun/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <system_error>

namespace cpprun {
namespace {

[[noreturn]] void fail(int error, const std::string& what) {
  throw std::system_error(error, std::generic_category(), "cpprun: " + what);
}

// Flushes a directory's entries to the disk: without it the rename itself may be lost in a crash.
void sync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // the file is written; only the durability of its name is in doubt
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

void write_file_atomically(const std::string& path, std::string_view bytes) {
  write_file_atomically(path, std::vector<std::string_view>{bytes});
}

void write_file_atomically(const std::string& path, const std::vector<std::string_view>& parts) {
  // The temporary file is in PATH's own directory: rename() is atomic only within a file system.
  const std::string temporary = path + ".tmp";
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd < 0) fail(errno, "cannot write " + path + " (creating " + temporary + ")");
  auto abandon = [&](int error, const std::string& what) {
    ::close(fd);
    ::unlink(temporary.c_str());
    fail(error, what);
  };
  std::size_t total = 0, written = 0;
  for (const std::string_view bytes : parts) total += bytes.size();
  for (const std::string_view bytes : parts) {
    for (std::size_t done = 0; done < bytes.size();) {
      const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) abandon(errno, "cannot write " + path + " (" + std::to_string(written) + " of " +
                                    std::to_string(total) + " bytes written to " + temporary + ")");
      done += static_cast<std::size_t>(n);
      written += static_cast<std::size_t>(n);
    }
  }
  // Data first, then the name: after the rename PATH must never name a file whose data is lost.
  if (::fsync(fd) != 0) abandon(errno, "cannot write " + path + " (flushing " + temporary + " to disk)");
  if (::close(fd) != 0) {
    const int error = errno;
    ::unlink(temporary.c_str());
    fail(error, "cannot write " + path + " (closing " + temporary + ")");
  }
  if (::rename(temporary.c_str(), path.c_str()) != 0) {
    const int error = errno;
    ::unlink(temporary.c_str());
    fail(error, "cannot write " + path + " (renaming " + temporary + " over it)");
  }
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  sync_directory(parent.empty() ? "." : parent.string());
}

}  // namespace cpprun
