// Reading a file a user named as a whole, safely: the bytes of a regular file (a symbolic link to
// one is followed, as Hugging Face's cache links its blobs), never blocking on a FIFO nor reading a
// device without end (/dev/zero), nor taking a directory for an empty file. No LibTorch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace cpprun::detail {

// PATH's bytes. Throws std::system_error when it cannot be opened or read, std::runtime_error when
// it is not a regular file; both messages read "cpprun: cannot read WHAT PATH: ...".
std::string read_regular_file(const std::string& path, const std::string& what);
// The same, refusing a file of more than `max_bytes` (FileTooLargeError, "cpprun: cannot read
// WHAT PATH: it is N bytes, more than ..."), before reading it and if it grows while read: for
// small files whose parse costs a multiple of their size. Its own type, so that a caller can say
// what such a file is (a checkpoint's index: damaged, CorruptCheckpointError) while a file that
// cannot be opened stays a std::system_error.
struct FileTooLargeError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
std::string read_regular_file(const std::string& path, const std::string& what, std::size_t max_bytes);

// PATH's first `count` bytes (all of it when shorter) and its size, opened and checked as
// read_regular_file does, with its errors: what a reader looks at to tell a file's format.
struct FileHead {
  std::string bytes;
  std::uint64_t size = 0;
};
FileHead read_file_head(const std::string& path, const std::string& what, std::size_t count);

// Which file a path named when it was read: its size and modification time (nanoseconds), as
// stat gives them on any node of a shared file system (the inode and device are left out: network
// and FUSE file systems number them per client). A save replaces its files by rename, so a file
// saved again differs in its time, even at the same size.
struct FileIdentity {
  std::uint64_t size = 0;
  std::int64_t modified_ns = 0;
  bool operator==(const FileIdentity& other) const { return size == other.size && modified_ns == other.modified_ns; }
  bool operator!=(const FileIdentity& other) const { return !(*this == other); }
};
// PATH's identity now, opened and checked as read_regular_file does, with its errors.
FileIdentity identity_of(const std::string& path, const std::string& what);
// The error of a file that is no longer the one that was read and checked: `now` is what it is.
struct FileChangedError : std::runtime_error {
  FileChangedError(const std::string& what, const FileIdentity& found) : std::runtime_error(what), now(found) {}
  FileIdentity now;
};

// `count` bytes of PATH from byte `offset` into `into`, opened and checked as read_regular_file
// does, with its errors, from the file `expected` identifies (else FileChangedError, before any
// byte is read): what a rank reads of a file another rank checked whole, its own part of a
// tensor. A file that ends before the bytes is a std::runtime_error ("cpprun: cannot read WHAT
// PATH: it is N bytes, and ends before the C bytes at byte O").
void read_file_range(const std::string& path, const std::string& what, const FileIdentity& expected,
                     std::uint64_t offset, std::size_t count, void* into);

}  // namespace cpprun::detail
