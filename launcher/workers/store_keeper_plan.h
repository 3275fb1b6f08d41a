// Which process serves the workers' c10d store, where its socket is bound, and the keeper's command
// line: the store keeper's decisions, pure and unit-tested apart from its I/O (store_keeper.h).
//
// Note [Store keeper]
// The agent that hosts the job's store (a single-node job's cpprun; in a multi-node job the agent
// hosting the rendezvous, node 0) binds the workers' store socket itself and hands the listening
// socket to a store keeper, a process of its own that serves LibTorch's own TCPStore server on it
// (c10d::TCPStoreOptions::masterListenFd: the libuv server takes the socket over). So, as under
// torchrun, whose agent hosts the store, every worker connects as a client
// (TORCHELASTIC_USE_AGENT_STORE=True: torch's env:// and cpprun::init_process_group() then put
// each attempt's keys under /worker/attempt_<TORCHELASTIC_RESTART_COUNT>), and:
// - the store listens on the loopback alone wherever the job allows it (one node, or several with
//   the store tunnel, Note [Store tunnel wired] in store_tunnel_io.h), for every kind of worker:
//   c10d's own server, which a Python or plain-LibTorch rank 0 starts, binds every interface;
// - the port is held from the start: no bind-and-close race for a free port, and no worker that
//   connects before rank 0 has bound it waits out c10d's connect retry (about 500 ms);
// - the launcher still links no LibTorch: the keeper does, and only for the store.
// Why a process and not the agent itself: LibTorch is ~450 MB of shared library that the launcher
// never loads (it starts in milliseconds). Why LibTorch's server and not one of ours: the workers
// speak its protocol, whatever it becomes.
// Which keeper: `cpprun-store-keeper`, built with the library and found beside the cpprun binary,
// for every kind of job (it loads libtorch_cpu alone and serves within a fraction of a second;
// a Python interpreter first imports all of torch, seconds and a few hundred MB). CPPRUN_STORE_KEEPER
// chooses another: a PATH to such a keeper, or `python`, the job's own interpreter (a Python
// program only), whose torch then speaks exactly the workers' protocol: for a torch much older or
// newer than the LibTorch cpprun was built with. A keeper that cannot be found is an error naming
// the file and what to do; there is no silent fallback to rank 0 hosting the store.
// Lifetime: one keeper per round (attempt, or c10d membership change), started before the round's
// workers and stopped (SIGKILL: the store holds nothing to keep) once every node's workers of the
// round are done or stopped, the exit barrier included. A fresh store per round, on a new socket:
// a restarted worker never sees the previous round's keys, including those outside PyTorch's
// per-attempt prefix and a c10d membership change's, which keeps TORCHELASTIC_RESTART_COUNT (so
// its prefix). The keeper dies with cpprun (PR_SET_PDEATHSIG, the guardian's sweep of the job
// token, and EOF on its standard input, which cpprun holds); a keeper that ends during its round
// ends the job, naming it: its workers' store is gone. It is the agent's child but neither a
// worker nor a leftover: Note [The job's helpers] in job_process_tree.h.
// TORCHELASTIC_USE_AGENT_STORE in cpprun's own environment changes nothing: as torchrun, the
// launcher sets it for every worker. --no_job_secret keeps the keeper; its store then listens on
// every interface of node 0 (the other nodes' workers connect to it directly), as c10d's would.
#pragma once

#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "workers/worker_process.h"

namespace cpprun::launcher {

// The keeper cannot be found or started: cpprun exits with exit_code().
class StoreKeeperError : public std::runtime_error {
 public:
  StoreKeeperError(const std::string& message, int exit_code) : std::runtime_error(message), exit_code_(exit_code) {}
  int exit_code() const { return exit_code_; }

 private:
  int exit_code_;
};

// The variable that chooses another keeper.
inline constexpr const char* kStoreKeeperVariable = "CPPRUN_STORE_KEEPER";
// The keeper's file name, beside cpprun's.
inline constexpr const char* kStoreKeeperName = "cpprun-store-keeper";

enum class KeeperKind {
  kExecutable,  // cpprun-store-keeper (comm/store_keeper_main.cpp), or a program taking its arguments
  kPython,      // the job's Python interpreter, running torch.distributed.TCPStore
};

struct KeeperChoice {
  KeeperKind kind = KeeperKind::kExecutable;
  std::string path;    // what to exec
  std::string source;  // for messages: "beside cpprun", "CPPRUN_STORE_KEEPER", ...
};

struct KeeperLookup {
  std::string launcher_path;  // cpprun's own executable (/proc/self/exe); "" if unknown
  const char* variable = nullptr;  // $CPPRUN_STORE_KEEPER (nullptr: unset)
  std::string python;  // the interpreter that runs the job's PROGRAM, when Python runs it; else ""
  std::string program;  // PROGRAM as typed, for messages
};

// The keeper to start, by Note [Store keeper]'s rules. `access_error(path)` is access(path, X_OK)'s
// errno, 0 if it may be executed. Throws StoreKeeperError: 127 (not there), 126 (not executable),
// 2 (a CPPRUN_STORE_KEEPER that means nothing), each saying what to do.
KeeperChoice choose_store_keeper(const KeeperLookup& lookup,
                                 const std::function<int(const std::string&)>& access_error);

// Who may reach the store.
enum class StoreReach {
  kLoopback,        // one node, or several with the store tunnel: this host's loopback alone
  kEveryInterface,  // several nodes without a job secret: the others' workers connect directly
};

// Where the store's socket is bound: the first of `addresses` this host has (the next one is tried
// only when the kernel lacks that address family or address), at `port` (0: the kernel picks).
struct StoreSocketPlan {
  std::vector<std::string> addresses;
  int port = 0;
};

// `ipv6`: the job meets at an IPv6 address (--master_addr, --rdzv_endpoint): ::1 first.
StoreSocketPlan plan_store_socket(StoreReach reach, bool ipv6, int port);

// Where the keeper's own client reaches a socket bound at `bound` (TCPStore's server connects to
// itself): the loopback of its family for a wildcard address, else `bound` itself.
std::string keeper_connect_address(const std::string& bound);

// Whether `address` (numeric) is a wildcard: the store is then reached at the host's own address.
bool is_wildcard_address(const std::string& address);

// The keeper's command: it serves the socket at descriptor `listen_fd` (inherited), bound to `bound`
// at `port`, until its standard input ends. `env` is its environment, NAME=value.
WorkerCommand keeper_command(const KeeperChoice& choice, int listen_fd, const std::string& bound, int port,
                             std::vector<std::string> env);

// What the agent hosting the store needs to start each round's keeper.
struct KeeperSettings {
  KeeperChoice choice;
  std::vector<std::string> env;  // the keeper's environment, NAME=value (make_keeper_env)
};

// What a keeper is called: "the workers' store keeper (pid 4242: /x/cpprun-store-keeper, serving
// 127.0.0.1:29500)"; with `node` ("node 0"), "the workers' store keeper on node 0 (...)".
std::string describe_keeper(const KeeperChoice& choice, int pid, const std::string& bound, int port,
                            const std::string& node = "");

// Why a keeper that ended during its round ends the job: `who` (describe_keeper) `how` ("exited with
// code 1"), then what that means.
std::string keeper_ended_reason(const std::string& who, const std::string& how);

}  // namespace cpprun::launcher
