// The store keeper's socket and process: see store_keeper.h.
#include "workers/store_keeper.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <ctime>
#include <optional>
#include <system_error>

#include "command_line/rendezvous_settings.h"  // endpoint_text
#include "common/socket_address.h"
#include "workers/job_process_tree.h"

namespace cpprun::launcher {
namespace {

// The keeper's socket in the keeper: fd 3, as its command line says.
constexpr int kKeeperListenFd = 3;
// A keeper that closed its standard input is given this long to exit before it is killed.
constexpr int kExitWaitMs = 2000;

// A TCP socket bound to address:port (0: the kernel picks) and listening, close-on-exec; throws
// std::system_error with the failing call's errno. SO_REUSEADDR as c10d's own server socket, so that
// a port left in TIME_WAIT by the round before is taken again, while one another process listens on
// is refused. "::" takes IPv4 too.
int listen_at(const std::string& address, int port) {
  const std::optional<SocketAddress> a = socket_address(address, port);
  if (!a) throw std::system_error(EINVAL, std::generic_category());
  const sockaddr_storage& storage = a->storage;
  const socklen_t size = a->size;
  const int fd = socket(storage.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw std::system_error(errno, std::generic_category(), "socket()");
  const int one = 1;
  const int zero = 0;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (storage.ss_family == AF_INET6 && is_wildcard_address(address)) {
    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
  }
  if (bind(fd, reinterpret_cast<const sockaddr*>(&storage), size) != 0 || listen(fd, SOMAXCONN) != 0) {
    const int error = errno;
    close(fd);
    throw std::system_error(error, std::generic_category());
  }
  return fd;
}

// The keeper's wait status: reaped here, or kept by whichever reaper took it (Note [The job's helpers]).
// Once another reaper took it, its pid is not waited on again: it may be another process's by now
// (an orphan this subreaper adopted).
int reap(pid_t pid, bool wait) {
  if (reaped_helper_status(pid)) return forget_job_helper(pid).value_or(0);
  int status = 0;
  const pid_t got = wait_for_exit(pid, &status, wait ? 0 : WNOHANG);
  if (got == pid) {
    forget_job_helper(pid);
    return status;
  }
  if (got == 0) return -1;  // still running
  return forget_job_helper(pid).value_or(0);  // ECHILD: another reaper took it
}

}  // namespace

StoreSocket::StoreSocket(const StoreSocketPlan& plan, const std::string& port_flag) {
  for (std::size_t i = 0; i < plan.addresses.size() && fd_ < 0; ++i) {
    try {
      fd_ = listen_at(plan.addresses[i], plan.port);
      address_ = plan.addresses[i];
    } catch (const std::system_error& e) {
      const int error = e.code().value();
      const bool try_next = (error == EADDRNOTAVAIL || error == EAFNOSUPPORT) && i + 1 < plan.addresses.size();
      if (try_next) continue;
      const std::string where = endpoint_text(plan.addresses[i], plan.port);
      if (error == EADDRINUSE && !port_flag.empty()) {
        throw StoreKeeperError("cpprun: cannot listen for the workers' store at " + where + " (" + port_flag + "=" +
                                   std::to_string(plan.port) + "): " + std::strerror(error) +
                                   ": another job or program holds that port on this host. Give this job another "
                                   "with " + port_flag + "=PORT, or leave " + port_flag + " out for a free one",
                               1);
      }
      throw StoreKeeperError("cpprun: cannot listen for the workers' store at " + where + ": " +
                                 std::strerror(error),
                             1);
    }
  }
  port_ = bound_port(fd_);
}

StoreSocket::~StoreSocket() {
  if (fd_ >= 0) close(fd_);
}

int StoreSocket::drop_waiting_connections() const {
  int dropped = 0;
  for (pollfd waiting{fd_, POLLIN, 0}; poll(&waiting, 1, 0) > 0 && (waiting.revents & POLLIN); waiting.revents = 0) {
    const int connection = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (connection < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      break;  // EAGAIN: another took it; anything else: nothing to drop
    }
    close(connection);
    ++dropped;
  }
  return dropped;
}

StoreKeeper::StoreKeeper(const KeeperSettings& settings, const StoreSocketPlan& plan, const std::string& port_flag,
                         const SignalRelay& relay, const std::string& node) {
  const StoreSocket socket(plan, port_flag);  // closed here once the keeper holds its copy
  address_ = socket.address();
  start(settings, fcntl(socket.fd(), F_DUPFD_CLOEXEC, 3), relay, node);
}

StoreKeeper::StoreKeeper(const KeeperSettings& settings, const StoreSocket& held, const SignalRelay& relay,
                         const std::string& node) {
  address_ = held.address();
  start(settings, fcntl(held.fd(), F_DUPFD_CLOEXEC, 3), relay, node);
}

void StoreKeeper::start(const KeeperSettings& settings, int listener, const SignalRelay& relay,
                        const std::string& node) {
  const KeeperChoice& choice = settings.choice;
  if (listener < 0) {
    throw StoreKeeperError(std::string("cpprun: cannot start the workers' store keeper: dup() failed: ") +
                               std::strerror(errno),
                           1);
  }
  port_ = bound_port(listener);
  // cpprun's end (close-on-exec: no worker inherits it) sees EOF when the keeper ends; the keeper's
  // end, its standard input, sees EOF when cpprun closes it or dies.
  int watch[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, watch) != 0) {
    const int error = errno;
    close(listener);
    throw StoreKeeperError(std::string("cpprun: cannot start the workers' store keeper: socketpair() failed: ") +
                               std::strerror(error),
                           1);
  }
  fcntl(watch[0], F_SETFL, fcntl(watch[0], F_GETFL) | O_NONBLOCK);
  const WorkerCommand command = keeper_command(choice, kKeeperListenFd, address_, port_, settings.env);
  try {
    // Its output goes to cpprun's stderr; it runs in a session of its own, out of reach of the
    // terminal's signals and of the workers' (spawn_worker, Note [Worker sessions]).
    pid_ = spawn_worker(command, {STDERR_FILENO, -1, listener, kKeeperListenFd, watch[1]}, relay);
  } catch (const SpawnError& e) {
    close(listener);
    close(watch[0]);
    close(watch[1]);
    throw StoreKeeperError(std::string(e.what()) + ": the workers' store keeper (" + choice.source +
                               ") could not be started; rebuild or reinstall it beside cpprun, or set " +
                               kStoreKeeperVariable + " (docs/launcher.md, \"The workers' store\")",
                           1);
  }
  add_job_helper(pid_);
  // The keeper holds the socket now: once it is gone, connections are refused, not left waiting
  // (unless cpprun holds the socket for later rounds: Note [A fixed store port is held between rounds]).
  close(listener);
  close(watch[1]);
  watch_fd_ = watch[0];
  description_ = describe_keeper(choice, pid_, address_, port_, node);
}

StoreKeeper::~StoreKeeper() { stop(); }

std::optional<std::string> StoreKeeper::check_ended() {
  if (watch_fd_ < 0) return std::nullopt;
  char bytes[256];
  const ssize_t got = retry_on_eintr([&] { return read(watch_fd_, bytes, sizeof(bytes)); });
  if (got > 0 || (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))) return std::nullopt;  // it runs
  close(watch_fd_);
  watch_fd_ = -1;
  // EOF: the keeper exited, or closed its standard input (then it is given a moment, and killed).
  int status = -1;
  for (int waited = 0; (status = reap(pid_, false)) < 0 && waited < kExitWaitMs; waited += 10) {
    const timespec pause{0, 10 * 1000 * 1000};
    nanosleep(&pause, nullptr);
  }
  std::string how;
  if (status < 0) {
    if (!reaped_helper_status(pid_)) kill(pid_, SIGKILL);  // see stop()
    status = reap(pid_, true);
    how = "closed its standard input (and was killed)";
  } else {
    how = WorkerExit::from_wait_status(status).describe();
  }
  pid_ = -1;
  return how;
}

void StoreKeeper::stop() {
  if (pid_ > 0) {
    // Not once another reaper took it: its pid may be another process's by now.
    if (!reaped_helper_status(pid_)) kill(pid_, SIGKILL);
    reap(pid_, true);
    pid_ = -1;
  }
  if (watch_fd_ >= 0) close(watch_fd_);
  watch_fd_ = -1;
}

std::vector<pollfd> StoreKeeperWatch::poll_fds() const {
  if (!ended_.empty()) return {};
  return {keeper_.poll_entry()};
}

void StoreKeeperWatch::on_ready(int fd, short /*revents*/) {
  if (!keeper_.owns(fd)) return;
  if (const std::optional<std::string> how = keeper_.check_ended()) {
    ended_ = keeper_ended_reason(keeper_.description(), *how);
  }
}

}  // namespace cpprun::launcher
