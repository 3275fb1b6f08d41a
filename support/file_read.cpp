// See file_read.h.
#include "support/file_read.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <system_error>

namespace cpprun::detail {
namespace {

const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a plain file";
}

class Descriptor {
 public:
  explicit Descriptor(int fd) : fd_(fd) {}
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  ~Descriptor() { ::close(fd_); }
  int get() const { return fd_; }

 private:
  int fd_;
};

// PATH opened for reading; `cannot` starts the error.
int open_for_reading(const std::string& path, const std::string& cannot) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer, forever.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) throw std::system_error(errno, std::generic_category(), cannot);
  return fd;
}

// Throws unless `file` is a regular file; `facts` gets its stat.
void check_regular(const Descriptor& file, const std::string& cannot, struct stat& facts) {
  if (::fstat(file.get(), &facts) != 0) throw std::system_error(errno, std::generic_category(), cannot);
  if (!S_ISREG(facts.st_mode)) {
    throw std::runtime_error(cannot + ": it is " + file_kind(facts.st_mode) +
                             ", not a regular file; give the path of the file itself");
  }
}

// Up to `room` bytes into `into`; 0 at the end.
std::size_t read_some(const Descriptor& file, char* into, std::size_t room, const std::string& cannot) {
  for (;;) {
    const ssize_t got = ::read(file.get(), into, room);
    if (got >= 0) return static_cast<std::size_t>(got);
    if (errno != EINTR) throw std::system_error(errno, std::generic_category(), cannot);
  }
}

}  // namespace

FileHead read_file_head(const std::string& path, const std::string& what, std::size_t count) {
  const std::string cannot = "cpprun: cannot read " + what + " " + path;
  const Descriptor file(open_for_reading(path, cannot));
  struct stat facts {};
  check_regular(file, cannot, facts);
  FileHead head;
  head.size = static_cast<std::uint64_t>(facts.st_size);
  head.bytes.resize(count);
  std::size_t have = 0;
  while (have < count) {
    const std::size_t got = read_some(file, head.bytes.data() + have, count - have, cannot);
    if (got == 0) break;
    have += got;
  }
  head.bytes.resize(have);
  return head;
}

std::string read_regular_file(const std::string& path, const std::string& what) {
  return read_regular_file(path, what, std::numeric_limits<std::size_t>::max());
}

std::string read_regular_file(const std::string& path, const std::string& what, std::size_t max_bytes) {
  const std::string cannot = "cpprun: cannot read " + what + " " + path;
  const Descriptor file(open_for_reading(path, cannot));
  struct stat facts {};
  check_regular(file, cannot, facts);
  const auto too_large = [&](std::uint64_t size) {
    throw FileTooLargeError(cannot + ": it is " + std::to_string(size) + " bytes" + (size > static_cast<std::uint64_t>(facts.st_size) ? " or more" : "") +
                             ", more than the " + std::to_string(max_bytes) + " such a file may be");
  };
  if (static_cast<std::uint64_t>(facts.st_size) > max_bytes) too_large(static_cast<std::uint64_t>(facts.st_size));
  // Straight into the string up to the size fstat gave, then on until the end through a small
  // buffer: the size is only a hint (a file may grow while read; /proc's files say 0), and growing
  // the string to probe for the end would copy a large file once more.
  std::string bytes(static_cast<std::size_t>(facts.st_size), '\0');
  std::size_t have = 0;
  const auto read_some_of_file = [&](char* into, std::size_t room) { return read_some(file, into, room, cannot); };
  while (have < bytes.size()) {
    const std::size_t got = read_some_of_file(bytes.data() + have, bytes.size() - have);
    if (got == 0) break;
    have += got;
  }
  bytes.resize(have);
  char more[1 << 12];
  for (std::size_t got; (got = read_some_of_file(more, sizeof more)) > 0;) {
    if (bytes.size() + got > max_bytes) too_large(bytes.size() + got);
    bytes.append(more, got);
  }
  return bytes;
}

namespace {

FileIdentity identity_from(const struct stat& facts) {
  return {static_cast<std::uint64_t>(facts.st_size),
          static_cast<std::int64_t>(facts.st_mtim.tv_sec) * 1000000000 + facts.st_mtim.tv_nsec};
}

std::string identity_text(const FileIdentity& id) {
  return std::to_string(id.size) + " bytes, modified at " + std::to_string(id.modified_ns / 1000000000) + "." +
         std::to_string(1000000000 + id.modified_ns % 1000000000).substr(1) + " s";
}

}  // namespace

FileIdentity identity_of(const std::string& path, const std::string& what) {
  const std::string cannot = "cpprun: cannot read " + what + " " + path;
  const Descriptor file(open_for_reading(path, cannot));
  struct stat facts {};
  check_regular(file, cannot, facts);
  return identity_from(facts);
}

void read_file_range(const std::string& path, const std::string& what, const FileIdentity& expected,
                     std::uint64_t offset, std::size_t count, void* into) {
  const std::string cannot = "cpprun: cannot read " + what + " " + path;
  const Descriptor file(open_for_reading(path, cannot));
  struct stat facts {};
  check_regular(file, cannot, facts);
  const FileIdentity now = identity_from(facts);
  if (now != expected) {
    throw FileChangedError(cannot + ": it is not the file that was checked (" + identity_text(expected) + "; now " +
                           identity_text(now) + "): was it saved again during the load, or is another file at this "
                           "path on this node? Load a directory no save is writing to, at one path every rank sees.",
                           now);
  }
  char* at = static_cast<char*>(into);
  for (std::size_t have = 0; have < count;) {
    const ssize_t got = ::pread(file.get(), at + have, count - have, static_cast<off_t>(offset + have));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) throw std::system_error(errno, std::generic_category(), cannot);
    if (got == 0) {
      throw std::runtime_error(cannot + ": it is " + std::to_string(now.size) + " bytes, and ends before the " +
                               std::to_string(count) + " bytes at byte " + std::to_string(offset));
    }
    have += static_cast<std::size_t>(got);
  }
}

}  // namespace cpprun::detail
