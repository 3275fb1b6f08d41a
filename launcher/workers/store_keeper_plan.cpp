// See store_keeper_plan.h.
#include "workers/store_keeper_plan.h"

#include <cerrno>
#include <cstring>

#include "command_line/rendezvous_settings.h"  // endpoint_text

namespace cpprun::launcher {
namespace {

// The Python keeper: LibTorch's TCPStore server of the job's own torch on the inherited socket,
// until standard input ends (argv: FD HOST PORT). Python ignores SIGPIPE, as a server must.
constexpr const char* kPythonKeeper =
    "import os, sys\n"
    "from torch.distributed import TCPStore\n"
    "store = TCPStore(sys.argv[2], int(sys.argv[3]), is_master=True, wait_for_workers=False,\n"
    "                 master_listen_fd=int(sys.argv[1]), use_libuv=True)\n"
    "while os.read(0, 4096):\n"
    "    pass\n"
    "os._exit(0)\n";

std::string directory_of(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
}

// What a keeper that cannot run means, with the shell's exit codes.
[[noreturn]] void unusable(const std::string& what, const std::string& path, int error, const std::string& fix) {
  const std::string problem =
      error == ENOENT ? "does not exist" : "cannot be executed (" + std::string(std::strerror(error)) + ")";
  throw StoreKeeperError("cpprun: " + what + " " + path + " " + problem +
                             ". cpprun's agent hosts the workers' c10d store, as torchrun's does "
                             "(TORCHELASTIC_USE_AGENT_STORE=True), in a store keeper process: " + fix,
                         error == ENOENT ? 127 : 126);
}

}  // namespace

KeeperChoice choose_store_keeper(const KeeperLookup& lookup,
                                 const std::function<int(const std::string&)>& access_error) {
  const std::string variable = lookup.variable != nullptr ? lookup.variable : "";
  const std::string other_ways = std::string("set ") + kStoreKeeperVariable + "=PATH to a " + kStoreKeeperName +
                                 " elsewhere, or " + kStoreKeeperVariable +
                                 "=python to have a Python program's interpreter (with torch) serve it";
  if (variable.empty()) {
    if (lookup.launcher_path.empty()) {
      throw StoreKeeperError(std::string("cpprun: cannot find ") + kStoreKeeperName +
                                 ", the workers' store keeper: where this cpprun is (/proc/self/exe) could not be "
                                 "read; " + other_ways,
                             127);
    }
    const std::string path = directory_of(lookup.launcher_path) + "/" + kStoreKeeperName;
    if (const int error = access_error(path); error != 0) {
      unusable("the workers' store keeper", path, error,
               std::string("it is built with cpprun (scripts/build.sh, or cmake --build BUILD_DIR --target ") +
                   kStoreKeeperName + ") and installed beside it; build or install it there, or " + other_ways);
    }
    return {KeeperKind::kExecutable, path, "beside cpprun"};
  }
  const std::string named = std::string(kStoreKeeperVariable) + "=" + variable;
  if (variable == "python") {
    if (lookup.python.empty()) {
      throw StoreKeeperError("cpprun: " + named + ": PROGRAM '" + lookup.program +
                                 "' is not run by Python (a .py script, -m or --run_path), so there is no job "
                                 "interpreter to serve the workers' store; unset " + kStoreKeeperVariable + " for " +
                                 kStoreKeeperName + ", or set it to the PATH of one",
                             2);
    }
    return {KeeperKind::kPython, lookup.python, named};
  }
  if (variable.find('/') == std::string::npos) {
    throw StoreKeeperError("cpprun: " + named + ": expected the path (with a /) of a " + kStoreKeeperName +
                               ", or 'python' for a Python program's interpreter; unset it for the " +
                               kStoreKeeperName + " beside cpprun",
                           2);
  }
  if (const int error = access_error(variable); error != 0) {
    unusable("the workers' store keeper named by " + std::string(kStoreKeeperVariable) + ",", variable, error,
             "correct the path, or unset " + std::string(kStoreKeeperVariable) + " for the " + kStoreKeeperName +
                 " beside cpprun");
  }
  return {KeeperKind::kExecutable, variable, kStoreKeeperVariable};
}

StoreSocketPlan plan_store_socket(StoreReach reach, bool ipv6, int port) {
  if (reach == StoreReach::kLoopback) {
    return {ipv6 ? std::vector<std::string>{"::1", "127.0.0.1"} : std::vector<std::string>{"127.0.0.1", "::1"}, port};
  }
  // "::" takes IPv4 connections too (the socket is made dual-stack).
  return {ipv6 ? std::vector<std::string>{"::", "0.0.0.0"} : std::vector<std::string>{"0.0.0.0"}, port};
}

bool is_wildcard_address(const std::string& address) { return address == "0.0.0.0" || address == "::"; }

std::string keeper_connect_address(const std::string& bound) {
  if (bound == "0.0.0.0") return "127.0.0.1";
  if (bound == "::") return "::1";
  return bound;
}

WorkerCommand keeper_command(const KeeperChoice& choice, int listen_fd, const std::string& bound, int port,
                             std::vector<std::string> env) {
  const std::string host = keeper_connect_address(bound);
  if (choice.kind == KeeperKind::kPython) {
    return {choice.path,
            {choice.path, "-c", kPythonKeeper, std::to_string(listen_fd), host, std::to_string(port)},
            std::move(env)};
  }
  return {choice.path,
          {choice.path, "--listen-fd=" + std::to_string(listen_fd), "--host=" + host, "--port=" + std::to_string(port)},
          std::move(env)};
}

std::string describe_keeper(const KeeperChoice& choice, int pid, const std::string& bound, int port,
                            const std::string& node) {
  const std::string python = choice.kind == KeeperKind::kPython ? " (" + choice.source + ")" : "";
  return "the workers' store keeper" + (node.empty() ? "" : " on " + node) + " (pid " + std::to_string(pid) + ": " +
         choice.path + python + ", serving " + endpoint_text(bound, port) + ")";
}

std::string keeper_ended_reason(const std::string& who, const std::string& how) {
  return who + " " + how + " while the workers ran: their c10d store is gone with it, so the job cannot go on "
                           "(what the keeper printed, if anything, is above)";
}

}  // namespace cpprun::launcher
