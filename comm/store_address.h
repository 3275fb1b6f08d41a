// Where the rendezvous store lives: MASTER_ADDR resolved once, up front, so that a name that
// does not resolve fails at once, naming the host; and, for a job on one host, a listening
// socket on the loopback only for rank 0's store, instead of c10d's default of every interface.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "cpprun/env.h"

namespace cpprun::detail {

// The addresses MASTER_ADDR resolves to, as text ("127.0.0.1", "::1"). Throws c10::Error naming
// the host and the resolver's reason when it resolves to nothing.
std::vector<std::string> resolve_master(const DistEnv& env);

// The loopback address rank 0's store should listen on, or nullopt to listen on every interface
// (c10d's default). Loopback when the job is on this host only: MASTER_ADDR is a loopback
// address, or every rank is on this node and MASTER_ADDR resolves to loopback addresses only.
std::optional<std::string> store_loopback_address(const DistEnv& env,
                                                  const std::vector<std::string>& resolved);

// A TCP socket bound to `address`:`port` and listening, for c10d::TCPStoreOptions::masterListenFd
// (the store takes it over). Throws c10::Error, with how to pick another port, when the port is
// taken.
int listen_on(const std::string& address, int port, const DistEnv& env);

// The error for a MASTER_PORT that is already taken, whoever found it (us or c10d).
[[noreturn]] void throw_port_in_use(const DistEnv& env, const std::string& detail);

}  // namespace cpprun::detail
