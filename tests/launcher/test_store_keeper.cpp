// Unit tests of the store keeper (Note [Store keeper] in workers/store_keeper_plan.h): which keeper,
// where its socket is bound and what it is told (pure), and the process around a stand-in keeper (a
// shell script: no LibTorch here), how its end is seen and that it is stopped and reaped.
#include "catch.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "comm/store_keeper_log.h"
#include "scratch_dir.h"
#include "workers/job_process_tree.h"
#include "workers/signal_relay.h"
#include "workers/store_keeper.h"
#include "workers/store_keeper_plan.h"

using namespace cpprun::launcher;
using Catch::Matchers::Contains;

namespace {

// access(X_OK)'s answer for a few paths: absent ones ENOENT.
std::function<int(const std::string&)> files(std::map<std::string, int> errors) {
  return [errors](const std::string& path) {
    const auto it = errors.find(path);
    return it == errors.end() ? ENOENT : it->second;
  };
}

KeeperLookup lookup(const char* variable = nullptr, const std::string& python = "") {
  return {"/opt/cpprun/bin/cpprun", variable, python, "train.py"};
}

// Catches the StoreKeeperError `call` throws.
template <typename Call>
StoreKeeperError error_of(const Call& call) {
  try {
    call();
  } catch (const StoreKeeperError& e) {
    return e;
  }
  FAIL("no StoreKeeperError was thrown");
  return StoreKeeperError("", 0);
}

std::string write_script(const launcher_test::ScratchDir& dir, const std::string& name, const std::string& body) {
  const std::string path = dir.path + "/" + name;
  std::ofstream(path) << "#!/bin/sh\n" << body << "\n";
  chmod(path.c_str(), 0755);
  return path;
}

// Whether `fd` becomes readable within `ms`.
bool readable_within(int fd, int ms) {
  pollfd entry{fd, POLLIN, 0};
  return poll(&entry, 1, ms) == 1;
}

// A TCP connect to 127.0.0.1:port: whether it is accepted (a listening socket's backlog takes it).
bool connects(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in at{};
  at.sin_family = AF_INET;
  at.sin_port = htons(static_cast<std::uint16_t>(port));
  at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool ok = connect(fd, reinterpret_cast<const sockaddr*>(&at), sizeof(at)) == 0;
  close(fd);
  return ok;
}

// The stand-in's command line, as it saw it, once it wrote it.
std::string wait_for_file(const std::string& path) {
  for (int i = 0; i < 500; ++i) {
    std::ifstream in(path);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (!text.empty() && text.back() == '\n') return text;
    usleep(10 * 1000);
  }
  return "";
}

}  // namespace

TEST_CASE("store_keeper: the keeper beside cpprun, unless CPPRUN_STORE_KEEPER says otherwise", "[store_keeper]") {
  const KeeperChoice beside =
      choose_store_keeper(lookup(), files({{"/opt/cpprun/bin/cpprun-store-keeper", 0}}));
  CHECK(beside.kind == KeeperKind::kExecutable);
  CHECK(beside.path == "/opt/cpprun/bin/cpprun-store-keeper");
  CHECK(beside.source == "beside cpprun");
  // An empty variable counts as unset.
  CHECK(choose_store_keeper(lookup(""), files({{"/opt/cpprun/bin/cpprun-store-keeper", 0}})).path == beside.path);

  const KeeperChoice named = choose_store_keeper(lookup("/elsewhere/keeper"), files({{"/elsewhere/keeper", 0}}));
  CHECK(named.kind == KeeperKind::kExecutable);
  CHECK(named.path == "/elsewhere/keeper");

  const KeeperChoice python = choose_store_keeper(lookup("python", "/venv/bin/python"), files({}));
  CHECK(python.kind == KeeperKind::kPython);
  CHECK(python.path == "/venv/bin/python");
  CHECK(python.source == "CPPRUN_STORE_KEEPER=python");
}

TEST_CASE("store_keeper: a keeper that cannot run is one error naming the file and what to do", "[store_keeper]") {
  const StoreKeeperError missing = error_of([] { choose_store_keeper(lookup(), files({})); });
  CHECK(missing.exit_code() == 127);
  CHECK_THAT(missing.what(), Contains("/opt/cpprun/bin/cpprun-store-keeper does not exist"));
  CHECK_THAT(missing.what(), Contains("--target cpprun-store-keeper"));
  CHECK_THAT(missing.what(), Contains("CPPRUN_STORE_KEEPER=PATH"));
  CHECK_THAT(missing.what(), Contains("TORCHELASTIC_USE_AGENT_STORE=True"));

  const StoreKeeperError denied =
      error_of([] { choose_store_keeper(lookup(), files({{"/opt/cpprun/bin/cpprun-store-keeper", EACCES}})); });
  CHECK(denied.exit_code() == 126);
  CHECK_THAT(denied.what(), Contains("cannot be executed (Permission denied)"));

  const StoreKeeperError named_missing = error_of([] { choose_store_keeper(lookup("/no/keeper"), files({})); });
  CHECK(named_missing.exit_code() == 127);
  CHECK_THAT(named_missing.what(), Contains("named by CPPRUN_STORE_KEEPER, /no/keeper does not exist"));

  const StoreKeeperError word = error_of([] { choose_store_keeper(lookup("keeper"), files({})); });
  CHECK(word.exit_code() == 2);
  CHECK_THAT(word.what(), Contains("CPPRUN_STORE_KEEPER=keeper: expected the path (with a /)"));

  const StoreKeeperError no_python = error_of([] { choose_store_keeper(lookup("python", ""), files({})); });
  CHECK(no_python.exit_code() == 2);
  CHECK_THAT(no_python.what(), Contains("PROGRAM 'train.py' is not run by Python"));

  const StoreKeeperError nowhere = error_of([] { choose_store_keeper({"", nullptr, "", "./train"}, files({})); });
  CHECK(nowhere.exit_code() == 127);
  CHECK_THAT(nowhere.what(), Contains("/proc/self/exe"));
}

TEST_CASE("store_keeper: the loopback alone unless the other nodes connect directly", "[store_keeper]") {
  CHECK(plan_store_socket(StoreReach::kLoopback, false, 29500).addresses ==
        std::vector<std::string>{"127.0.0.1", "::1"});
  CHECK(plan_store_socket(StoreReach::kLoopback, false, 29500).port == 29500);
  CHECK(plan_store_socket(StoreReach::kLoopback, true, 0).addresses == std::vector<std::string>{"::1", "127.0.0.1"});
  CHECK(plan_store_socket(StoreReach::kEveryInterface, false, 0).addresses == std::vector<std::string>{"0.0.0.0"});
  CHECK(plan_store_socket(StoreReach::kEveryInterface, true, 0).addresses ==
        std::vector<std::string>{"::", "0.0.0.0"});
  CHECK(keeper_connect_address("0.0.0.0") == "127.0.0.1");
  CHECK(keeper_connect_address("::") == "::1");
  CHECK(keeper_connect_address("::1") == "::1");
  CHECK(is_wildcard_address("::"));
  CHECK_FALSE(is_wildcard_address("127.0.0.1"));
}

TEST_CASE("store_keeper: what the keeper is told", "[store_keeper]") {
  const WorkerCommand exe = keeper_command({KeeperKind::kExecutable, "/b/cpprun-store-keeper", "beside cpprun"}, 3,
                                           "0.0.0.0", 41000, {"A=1"});
  CHECK(exe.path == "/b/cpprun-store-keeper");
  CHECK(exe.argv == std::vector<std::string>{"/b/cpprun-store-keeper", "--listen-fd=3", "--host=127.0.0.1",
                                             "--port=41000"});
  CHECK(exe.env == std::vector<std::string>{"A=1"});
  const WorkerCommand python = keeper_command({KeeperKind::kPython, "/venv/bin/python", "CPPRUN_STORE_KEEPER=python"},
                                              3, "::1", 41000, {});
  REQUIRE(python.argv.size() == 6);
  CHECK(python.argv[1] == "-c");
  CHECK_THAT(python.argv[2], Contains("master_listen_fd=int(sys.argv[1])"));
  CHECK_THAT(python.argv[2], Contains("TCPStore("));
  CHECK((std::vector<std::string>(python.argv.begin() + 3, python.argv.end()) ==
         std::vector<std::string>{"3", "::1", "41000"}));
  CHECK(describe_keeper({KeeperKind::kPython, "/venv/bin/python", "CPPRUN_STORE_KEEPER=python"}, 42, "::1", 41000,
                        "node 0") ==
        "the workers' store keeper on node 0 (pid 42: /venv/bin/python (CPPRUN_STORE_KEEPER=python), serving "
        "[::1]:41000)");
  CHECK_THAT(keeper_ended_reason("the workers' store keeper (pid 42)", "exited with code 1"),
             Contains("the workers' store keeper (pid 42) exited with code 1 while the workers ran"));
}

TEST_CASE("store_keeper: the socket listens from the start, the keeper's end is seen and it is reaped",
          "[store_keeper]") {
  launcher_test::ScratchDir dir;
  SignalRelay relay;
  // A stand-in that notes its arguments and whether fd 3 is there, then reads its standard input to EOF.
  const std::string args = dir.path + "/args";
  const std::string keeper = write_script(
      dir, "keeper", "[ -e /proc/self/fd/3 ] && echo \"fd3 $*\" >" + args + ".tmp && mv " + args + ".tmp " + args +
                         "\nexec cat >/dev/null");
  const KeeperSettings settings{{KeeperKind::kExecutable, keeper, "test"}, {"PATH=/bin:/usr/bin"}};
  StoreKeeper store(settings, plan_store_socket(StoreReach::kLoopback, false, 0), "", relay);
  CHECK(store.address() == "127.0.0.1");
  REQUIRE(store.port() > 0);
  CHECK(connects(store.port()));  // held from the start: nobody accepts, the backlog does
  CHECK(wait_for_file(args) == "fd3 --listen-fd=3 --host=127.0.0.1 --port=" + std::to_string(store.port()) + "\n");
  CHECK_FALSE(readable_within(store.poll_entry().fd, 0));

  SECTION("killed: its end says how, and the attempt's watch ends the attempt naming it") {
    StoreKeeperWatch watch(store);
    REQUIRE(watch.poll_fds().size() == 1);
    kill(store.pid(), SIGKILL);
    REQUIRE(readable_within(store.poll_entry().fd, 5000));
    watch.on_ready(store.poll_entry().fd, POLLIN);
    REQUIRE(watch.attempt_ended());
    CHECK_THAT(watch.end_reason(), Contains(store.description() + " killed by SIGKILL"));
    CHECK_THAT(store.description(), Contains(keeper + ", serving 127.0.0.1:" + std::to_string(store.port())));
    CHECK(watch.poll_fds().empty());
    CHECK_FALSE(connects(store.port()));  // the keeper held the only copy of the socket
  }
  SECTION("reaped by another waitpid(-1) first: its status is kept for it") {
    const pid_t pid = store.pid();
    kill(pid, SIGTERM);
    REQUIRE(readable_within(store.poll_entry().fd, 5000));
    int status = 0;
    REQUIRE(waitpid(-1, &status, 0) == pid);
    CHECK(keep_helper_status(pid, status));
    CHECK(store.check_ended() == "killed by SIGTERM (Terminated)");
  }
  SECTION("stopped after another waitpid(-1) reaped it: not signalled again, its status forgotten") {
    const pid_t pid = store.pid();
    kill(pid, SIGKILL);
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    CHECK(keep_helper_status(pid, status));
    CHECK(reaped_helper_status(pid) == status);
    store.stop();
    CHECK_FALSE(reaped_helper_status(pid).has_value());
  }
  SECTION("stopped: killed and reaped, nothing left") {
    const pid_t pid = store.pid();
    store.stop();
    CHECK(kill(pid, 0) != 0);
    CHECK(errno == ESRCH);
    store.stop();  // again: nothing
  }
}

TEST_CASE("store_keeper: a keeper that exits at once; a port that is taken", "[store_keeper]") {
  launcher_test::ScratchDir dir;
  SignalRelay relay;
  const KeeperSettings settings{{KeeperKind::kExecutable, write_script(dir, "keeper", "exit 3"), "test"}, {}};
  StoreKeeper store(settings, plan_store_socket(StoreReach::kLoopback, false, 0), "", relay);
  REQUIRE(readable_within(store.poll_entry().fd, 5000));
  CHECK(store.check_ended() == "exited with code 3");
  CHECK_FALSE(store.check_ended().has_value());  // once

  // A port another socket listens on.
  const int holder = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in at{};
  at.sin_family = AF_INET;
  at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(bind(holder, reinterpret_cast<const sockaddr*>(&at), sizeof(at)) == 0);
  REQUIRE(listen(holder, 1) == 0);
  socklen_t size = sizeof(at);
  getsockname(holder, reinterpret_cast<sockaddr*>(&at), &size);
  const int port = ntohs(at.sin_port);
  const StoreKeeperError in_use = error_of([&] {
    StoreKeeper second(settings, plan_store_socket(StoreReach::kLoopback, false, port), "--master_port", relay);
  });
  close(holder);
  CHECK(in_use.exit_code() == 1);
  CHECK_THAT(in_use.what(), Contains("cannot listen for the workers' store at 127.0.0.1:" + std::to_string(port) +
                                     " (--master_port=" + std::to_string(port) + "): Address already in use"));
  CHECK_THAT(in_use.what(), Contains("leave --master_port out for a free one"));
}

// Note [A fixed store port is held between rounds]: what connected while no keeper served is closed
// before the next keeper starts; the socket goes on listening.
TEST_CASE("store_keeper: a held socket drops the connections made between rounds", "[store_keeper]") {
  const StoreSocket held(plan_store_socket(StoreReach::kLoopback, false, 0), "--master_port");
  sockaddr_in at{};
  at.sin_family = AF_INET;
  at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  at.sin_port = htons(static_cast<uint16_t>(held.port()));
  std::vector<int> clients;
  for (int i = 0; i < 3; ++i) {
    clients.push_back(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    REQUIRE(connect(clients.back(), reinterpret_cast<const sockaddr*>(&at), sizeof(at)) == 0);
    REQUIRE(write(clients.back(), "set", 3) == 3);
  }
  CHECK(held.drop_waiting_connections() == 3);
  CHECK(held.drop_waiting_connections() == 0);  // none left, and no wait
  for (const int client : clients) {
    char byte = 0;
    CHECK(read(client, &byte, 1) <= 0);  // closed by the listener's side: EOF or reset
    close(client);
  }
  const int late = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  CHECK(connect(late, reinterpret_cast<const sockaddr*>(&at), sizeof(at)) == 0);  // still listening
  close(late);
}

TEST_CASE("store_keeper: a keeper that cannot be executed is named", "[store_keeper]") {
  launcher_test::ScratchDir dir;
  SignalRelay relay;
  const KeeperSettings settings{{KeeperKind::kExecutable, dir.path + "/absent", "CPPRUN_STORE_KEEPER"}, {}};
  const StoreKeeperError error = error_of([&] {
    StoreKeeper store(settings, plan_store_socket(StoreReach::kLoopback, false, 0), "", relay);
  });
  CHECK(error.exit_code() == 1);
  CHECK_THAT(error.what(), Contains("cannot start '" + dir.path + "/absent'"));
  CHECK_THAT(error.what(), Contains("the workers' store keeper (CPPRUN_STORE_KEEPER) could not be started"));
}

// Note [The keeper's log never stops the store]: a burst of lines passes, then a trickle; what is
// left out is counted, and said once some seconds after the first of it.
TEST_CASE("store keeper: its log passes a burst, then a trickle, and counts what it leaves out", "[store_keeper]") {
  cpprun::keeper::LogLineBudget budget(/*burst=*/3, /*per_second=*/0.5);
  CHECK(budget.take(0));
  CHECK(budget.take(0));
  CHECK(budget.take(0));
  CHECK_FALSE(budget.take(0));    // the burst is spent
  CHECK_FALSE(budget.take(1.0));  // half a line earned
  CHECK(budget.take(2.0));        // a whole one
  CHECK(budget.report_due(4.9, 5) == 0);  // not yet 5 s since the first left out
  CHECK(budget.report_due(5.0, 5) == 2);
  CHECK(budget.report_due(100, 5) == 0);  // said once
  // A long quiet refills the burst, no more.
  for (int line = 0; line < 3; ++line) CHECK(budget.take(100));
  CHECK_FALSE(budget.take(100));
  budget.left_out(100);  // a line that passed but the console did not take
  CHECK(budget.report_due(100, 0) == 2);
}
