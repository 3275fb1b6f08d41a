// Note [A job on one host]
// torchrun runs `--rdzv_backend=c10d --nnodes=1:2 --rdzv_endpoint=localhost:PORT` on one machine with
// no more set-up, and PyTorch's own launcher tests do just that; cpprun refused it for want of a
// job secret. A secret guards the agents' port against whoever can reach it. When the endpoint is
// the loopback, only processes on this host can, and the ones to keep out are other users' (this
// user's own can already read an agent's memory and environment): so the agents share a secret
// that only this user can read, kept in a file of mode 0600 in a folder of mode 0700 that this user
// owns. The first agent writes it (whole, then linked into place, so that a second agent reads
// either nothing or all of it); the others read it. Another user's agent at the port cannot, and is
// refused as a stranger; a folder or file that another user owns, others may write or read, or
// that is a symbolic link is refused, with CPPRUN_JOB_SECRET as the way out. The file is named by
// the port and the rendezvous id, which every agent of the job is given alike; it stays after the
// job (64 bytes), and a later job at the same port and id shares it again.
// A job of one agent (max nodes 1) needs nothing shared: its secret is random and never written.
#include "common/host_secret.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "common/errors.h"
#include "common/job_secret.h"

namespace cpprun::launcher {
namespace {

constexpr std::size_t kSecretHexDigits = 64;  // 32 random bytes

const char* const kWayOut =
    "; or give the agents a secret yourself: `export CPPRUN_JOB_SECRET=$(openssl rand -hex 32)` before starting "
    "each of them";

std::string errno_text() { return std::strerror(errno); }

// This user's alone: not a link, owned by the effective user, nothing for group or others.
std::string why_not_private(const struct stat& st, bool want_folder) {
  if (want_folder ? !S_ISDIR(st.st_mode) : !S_ISREG(st.st_mode)) {
    return want_folder ? "it is not a folder (a symbolic link or a file)" : "it is not a plain file";
  }
  if (st.st_uid != ::geteuid()) return "another user (uid " + std::to_string(st.st_uid) + ") owns it";
  if ((st.st_mode & 077) != 0) return "its group or other users may use it (mode not 0700/0600)";
  return {};
}

void make_private_folder(const std::string& folder) {
  if (::mkdir(folder.c_str(), 0700) == 0) {
    ::chmod(folder.c_str(), 0700);  // a umask such as 0177 would leave the owner unable to enter it
  } else if (errno != EEXIST) {
    throw UsageError("cannot make " + folder + ", where the agents of a job on one host keep its secret (" +
                     errno_text() + ")" + kWayOut);
  }
  struct stat st {};
  if (::lstat(folder.c_str(), &st) != 0) {
    throw UsageError("cannot read " + folder + " (" + errno_text() + ")" + kWayOut);
  }
  if (std::string why = why_not_private(st, true); !why.empty()) {
    throw UsageError(folder + " is not this user's private folder: " + why +
                     "; the secret of a job on one host is kept only where no other user can reach it" + kWayOut);
  }
}

std::string file_name(int port, const std::string& rdzv_id) {
  const std::string text = "cpprun host secret\n" + std::to_string(port) + '\n' + rdzv_id;
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  if (EVP_Digest(text.data(), text.size(), digest, &size, EVP_sha256(), nullptr) != 1) {
    throw std::runtime_error("cpprun: OpenSSL's SHA-256 failed");
  }
  constexpr const char* kDigits = "0123456789abcdef";
  std::string name = "job-";
  for (unsigned int i = 0; i < 16 && i < size; ++i) name += {kDigits[digest[i] >> 4], kDigits[digest[i] & 0xf]};
  return name;
}

// Writes a fresh secret at `path`; when another agent of the job linked its own first, that one holds.
void write_once(const std::string& folder, const std::string& path) {
  const std::string temp = folder + "/.new-" + random_nonce();
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) throw UsageError("cannot write " + temp + " (" + errno_text() + ")" + kWayOut);
  const std::string secret = random_nonce() + random_nonce();
  errno = 0;
  // fchmod: whatever the umask, the owner reads it; fsync: a crash never leaves an empty file linked.
  const bool written = ::fchmod(fd, 0600) == 0 &&
                       ::write(fd, secret.data(), secret.size()) == static_cast<ssize_t>(secret.size()) &&
                       ::fsync(fd) == 0;
  const std::string write_error = errno != 0 ? errno_text() : "a short write";
  ::close(fd);
  // link() fails with EEXIST when an agent of the same job linked its own first: then that one holds.
  const bool linked = written && (::link(temp.c_str(), path.c_str()) == 0 || errno == EEXIST);
  const std::string error = written ? errno_text() : write_error;
  ::unlink(temp.c_str());
  if (!linked) throw UsageError("cannot write " + path + " (" + error + ")" + kWayOut);
}

std::string read_secret(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) throw UsageError("cannot read " + path + " (" + errno_text() + ")" + kWayOut);
  struct stat st {};
  std::string why = ::fstat(fd, &st) != 0 ? "fstat failed: " + errno_text() : why_not_private(st, false);
  std::string secret(kSecretHexDigits + 1, '\0');
  const ssize_t n = why.empty() ? ::read(fd, secret.data(), secret.size()) : 0;
  ::close(fd);
  if (why.empty() && n != static_cast<ssize_t>(kSecretHexDigits)) {
    why = "it holds " + std::to_string(n) + " bytes, not the " + std::to_string(kSecretHexDigits) + " hex digits cpprun writes";
  }
  if (!why.empty()) {
    throw UsageError(path + " cannot hold this job's secret: " + why + "; remove it, and the next agent writes a new one" +
                     kWayOut);
  }
  secret.resize(kSecretHexDigits);
  return secret;
}

}  // namespace

bool is_loopback_endpoint_host(const std::string& host) {
  if (host == "localhost") return true;
  in_addr v4{};
  if (::inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  return ::inet_pton(AF_INET6, host.c_str(), &v6) == 1 && std::memcmp(&v6, &in6addr_loopback, sizeof(v6)) == 0;
}

std::string host_secret_folder(const EnvLookup& env) {
  const std::optional<std::string> runtime = env("XDG_RUNTIME_DIR");
  struct stat st {};
  if (runtime && !runtime->empty() && runtime->front() == '/' && ::lstat(runtime->c_str(), &st) == 0 &&
      why_not_private(st, true).empty()) {
    return *runtime + "/cpprun";
  }
  return "/tmp/cpprun-" + std::to_string(::geteuid());
}

std::string host_secret_path(const std::string& folder, int port, const std::string& rdzv_id) {
  return folder + "/" + file_name(port, rdzv_id);
}

std::string shared_host_secret(const std::string& folder, int port, const std::string& rdzv_id) {
  make_private_folder(folder);
  const std::string path = host_secret_path(folder, port, rdzv_id);
  if (::faccessat(AT_FDCWD, path.c_str(), F_OK, AT_EACCESS) != 0) write_once(folder, path);
  return read_secret(path);
}

}  // namespace cpprun::launcher
