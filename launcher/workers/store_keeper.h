// The store keeper of one round: the workers' store socket bound by this agent, and the keeper
// process that serves LibTorch's TCPStore on it (Note [Store keeper] in store_keeper_plan.h).
#pragma once

#include <poll.h>
#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "workers/attempt.h"
#include "workers/store_keeper_plan.h"

namespace cpprun::launcher {

class SignalRelay;

// The workers' store's listening socket, bound as `plan` says, close-on-exec. Throws
// StoreKeeperError (exit code 1) when it cannot be bound (the port taken: `port_flag` names where
// the port came from, "" when the kernel picked it).
//
// Note [A fixed store port is held between rounds]: each round's keeper serves a socket of its own
// (a fresh store), but a port the user fixed (--master_port) is bound once and held by cpprun for
// the whole job, each keeper serving a copy of it, as torchrun's agent keeps its store listening
// through restarts. Bound anew each round, the port was free during the restart wait, and any
// local process that took it then ended the job with restarts left (an audit, 2026-12-07). What
// connects between rounds (a straggler of the round before, a stranger) waits in the backlog, and
// is closed before the next keeper starts (drop_waiting_connections): it must not reach the new
// round's fresh store.
class StoreSocket {
 public:
  StoreSocket(const StoreSocketPlan& plan, const std::string& port_flag);
  ~StoreSocket();
  StoreSocket(const StoreSocket&) = delete;
  StoreSocket& operator=(const StoreSocket&) = delete;

  int fd() const { return fd_; }
  const std::string& address() const { return address_; }
  int port() const { return port_; }
  // Accepts and closes every connection in the backlog; the number closed.
  int drop_waiting_connections() const;

 private:
  int fd_ = -1;
  std::string address_;
  int port_ = 0;
};

class StoreKeeper {
 public:
  // Binds the store's socket as `plan` says and starts settings.choice on it. The keeper is not
  // waited for: the socket listens from now on, and workers that connect before the keeper serves
  // wait in its backlog. Throws StoreKeeperError (exit code 1) when the socket cannot be bound (the
  // port taken: `port_flag` names where the port came from, "" when the kernel picked it) or the
  // keeper cannot be started. `node` names this node in its description ("node 0"; "" alone).
  StoreKeeper(const KeeperSettings& settings, const StoreSocketPlan& plan, const std::string& port_flag,
              const SignalRelay& relay, const std::string& node = "");
  // On a copy of `held`, which the caller keeps listening for the rounds after this one.
  StoreKeeper(const KeeperSettings& settings, const StoreSocket& held, const SignalRelay& relay,
              const std::string& node = "");
  // Stops the keeper if it still runs (SIGKILL) and reaps it.
  ~StoreKeeper();
  StoreKeeper(const StoreKeeper&) = delete;
  StoreKeeper& operator=(const StoreKeeper&) = delete;

  // Where the socket is bound ("127.0.0.1", "::1"; "0.0.0.0" or "::" for StoreReach::kEveryInterface).
  const std::string& address() const { return address_; }
  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  // "the workers' store keeper (pid 4242: ..., serving 127.0.0.1:29500)"
  const std::string& description() const { return description_; }

  // For poll(): cpprun's end of the keeper's standard input, readable (EOF) once the keeper has
  // ended. -1 once it has been seen to end.
  pollfd poll_entry() const { return {watch_fd_, POLLIN, 0}; }
  bool owns(int fd) const { return fd >= 0 && fd == watch_fd_; }
  // After poll_entry() was ready: nullopt while the keeper runs; else how it ended, reaped ("exited
  // with code 1", "killed by SIGKILL (Killed)"), once.
  std::optional<std::string> check_ended();

  // SIGKILL and reap, unless it has ended; a second call does nothing.
  void stop();

 private:
  // Starts the keeper on `listener`, which it closes.
  void start(const KeeperSettings& settings, int listener, const SignalRelay& relay, const std::string& node);

  std::string address_;
  int port_ = 0;
  pid_t pid_ = -1;
  int watch_fd_ = -1;  // closed once the keeper is seen to end, or stopped
  std::string description_;
};

// A single-node attempt's view of its keeper: the keeper's end ends the attempt (GroupEnd::kPeerEnded)
// with end_reason(). See run_attempt's `peers`.
class StoreKeeperWatch final : public PeerEvents {
 public:
  explicit StoreKeeperWatch(StoreKeeper& keeper) : keeper_(keeper) {}
  std::vector<pollfd> poll_fds() const override;
  void on_ready(int fd, short revents) override;
  bool attempt_ended() const override { return !ended_.empty(); }
  std::string end_reason() const override { return ended_; }

 private:
  StoreKeeper& keeper_;
  std::string ended_;  // keeper_ended_reason(), once the keeper ended
};

}  // namespace cpprun::launcher
