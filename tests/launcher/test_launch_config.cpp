// Unit tests of cpprun's command line: torchrun's option names, defaults, validation messages.
#include "catch.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "command_line/launch_config.h"
#include "usage_error_text.h"

using namespace cpprun::launcher;
using Catch::Matchers::Contains;

namespace {

HostFacts fake_host(int cpus = 8, int gpus = 0) {
  HostFacts host;
  host.cpu_count = cpus;
  host.gpu_count = gpus;
  host.pick_free_port = [] { return 45678; };
  host.random_run_id = [] { return std::string("11111111-2222-4333-8444-555555555555"); };
  host.hostname = "node7";
  return host;
}

const std::string kSecret = "0123456789abcdef0123";

// No scheduler variables, so the results do not depend on where the tests run (e.g. inside srun);
// the job secret that multi-node launches need.
std::optional<std::string> no_env(const std::string& name) {
  if (name == "CPPRUN_JOB_SECRET") return kSecret;
  return std::nullopt;
}

LaunchConfig parse(const std::vector<std::string>& args, const HostFacts& host = fake_host()) {
  const ParsedCommandLine cli = parse_launch_config(args, host, no_env);
  REQUIRE(cli.outcome == CliOutcome::kLaunch);
  return cli.config;
}

std::string cli_help(const std::vector<std::string>& args) {
  const ParsedCommandLine cli = parse_launch_config(args, fake_host(), no_env);
  REQUIRE(cli.outcome == CliOutcome::kShowHelp);
  return cli.help_text;
}

std::string usage_error(const std::vector<std::string>& args) {
  return usage_error_text([&] { parse_launch_config(args, fake_host(), no_env); });
}

}  // namespace

TEST_CASE("launch_config: defaults match torchrun's single-node defaults", "[launch_config]") {
  const LaunchConfig c = parse({"./train"});
  CHECK(c.nproc_per_node == 1);
  CHECK(c.nnodes == 1);
  CHECK(c.node_rank == 0);
  CHECK(c.master_addr == "127.0.0.1");
  // torchrun 2.x: one node without --master_port runs on a free port under a random (uuid4) run id.
  CHECK(c.master_port == 45678);
  CHECK(c.picked_port);
  CHECK_FALSE(c.standalone);
  CHECK(c.max_restarts == 0);
  CHECK(c.shutdown_timeout == std::chrono::seconds(5));
  CHECK(c.run_id == "11111111-2222-4333-8444-555555555555");
  CHECK(c.role == "default");
  CHECK(c.program == "./train");
  CHECK(c.program_args.empty());
  CHECK(c.join_timeout == std::chrono::seconds(900));  // static's `timeout`, as launcher/api.py sets it
}

TEST_CASE("launch_config: underscore and dash spellings are the same option", "[launch_config]") {
  for (const char* sep : {"_", "-"}) {
    const std::string s = sep;
    const LaunchConfig c = parse({"--nproc" + s + "per" + s + "node=3", "--node" + s + "rank", "0",
                                  "--master" + s + "addr=10.0.0.1", "--master" + s + "port", "1234",
                                  "--max" + s + "restarts=2", "--shutdown" + s + "timeout=0.5",
                                  "--rdzv" + s + "id=job7", "--monitor" + s + "interval=2",
                                  "--no" + s + "python", "--role=trainer", "./train"});
    INFO("separator " << s);
    CHECK(c.nproc_per_node == 3);
    CHECK(c.master_addr == "10.0.0.1");
    CHECK(c.master_port == 1234);
    CHECK(c.max_restarts == 2);
    CHECK(c.shutdown_timeout == std::chrono::milliseconds(500));
    CHECK(c.run_id == "job7");
    CHECK(c.monitor_interval == 2.0);
    CHECK(c.program_mode == ProgramMode::kNoPython);
    CHECK(c.role == "trainer");
  }
  CHECK(parse({"--run_id=a", "--master_port=29500", "x"}).run_id == "a");
  CHECK(parse({"--run-id", "b", "--master_port=29500", "x"}).run_id == "b");
}

TEST_CASE("launch_config: everything from PROGRAM on reaches the worker untouched", "[launch_config]") {
  const LaunchConfig c =
      parse({"--nproc_per_node=2", "./train", "--lr", "0.1", "--nproc_per_node", "5", "-h", "--", "x"});
  CHECK(c.nproc_per_node == 2);
  CHECK(c.program == "./train");
  CHECK(c.program_args == std::vector<std::string>{"--lr", "0.1", "--nproc_per_node", "5", "-h", "--", "x"});
}

TEST_CASE("launch_config: -- ends cpprun's options, even before a program named like a flag",
          "[launch_config]") {
  const LaunchConfig c = parse({"--nproc_per_node", "2", "--", "-weird", "--help"});
  CHECK(c.program == "-weird");
  CHECK(c.program_args == std::vector<std::string>{"--help"});
}

TEST_CASE("launch_config: a repeated option's last value wins, like argparse", "[launch_config]") {
  CHECK(parse({"--nproc_per_node=2", "--nproc-per-node=4", "x"}).nproc_per_node == 4);
}

TEST_CASE("launch_config: nproc_per_node accepts cpu, gpu and auto", "[launch_config]") {
  CHECK(parse({"--nproc_per_node=cpu", "x"}, fake_host(6, 2)).nproc_per_node == 6);
  CHECK(parse({"--nproc_per_node=gpu", "x"}, fake_host(6, 2)).nproc_per_node == 2);
  CHECK(parse({"--nproc_per_node=auto", "x"}, fake_host(6, 2)).nproc_per_node == 2);
  CHECK(parse({"--nproc_per_node=auto", "x"}, fake_host(6, 0)).nproc_per_node == 6);
  REQUIRE_THROWS_WITH(parse_launch_config({"--nproc_per_node=gpu", "x"}, fake_host(6, 0)),
                      Contains("--nproc_per_node=gpu") && Contains("no NVIDIA GPU"));
  CHECK_THAT(usage_error({"--nproc_per_node=xpu", "x"}),
             Contains("--nproc_per_node=xpu") && Contains("not Intel XPUs") && Contains("number of workers"));
}

TEST_CASE("launch_config: static nnodes is a fixed number of nodes; ranges need c10d", "[launch_config]") {
  CHECK(parse({"--nnodes=1", "x"}).nnodes == 1);
  CHECK(parse({"--nnodes=1:1", "x"}).nnodes == 1);
  CHECK(parse({"--nnodes=3", "--node_rank=2", "x"}).nnodes == 3);
  const LaunchConfig c = parse({"--nnodes=2:2", "--node_rank=1", "x"});
  CHECK(c.node_rank == 1);
  CHECK(c.min_nodes == 2);
  CHECK(c.max_nodes == 2);
  CHECK(c.rdzv_backend == RendezvousBackend::kStatic);
  CHECK_FALSE(is_multi_node(parse({"x"})));
  CHECK(is_multi_node(c));
  CHECK_THAT(usage_error({"--nnodes=1:4", "x"}),
             Contains("--nnodes=1:4") && Contains("--rdzv_backend=c10d") && Contains("--nnodes=4"));
  CHECK_THAT(usage_error({"--nnodes=0", "x"}), Contains("--nnodes=0") && Contains("expected"));
  CHECK_THAT(usage_error({"--nnodes=2:x", "x"}), Contains("--nnodes=2:x"));
  CHECK_THAT(usage_error({"--nnodes=3:2", "x"}), Contains("MIN is above MAX") && Contains("--nnodes=2:3"));
  CHECK_THAT(usage_error({"--nnodes=2", "--node_rank=2", "x"}), Contains("--node_rank=2") && Contains("0 to 1"));
  CHECK_THAT(usage_error({"--nnodes=2", "--standalone", "x"}), Contains("--standalone") && Contains("--nnodes=2"));
}

TEST_CASE("launch_config: static rendezvous options", "[launch_config]") {
  CHECK(parse({"--rdzv_backend=static", "x"}).nnodes == 1);
  CHECK_THAT(usage_error({"--rdzv-backend=etcd", "x"}), Contains("etcd") && Contains("not implemented"));
  CHECK_THAT(usage_error({"--rdzv_backend=zk", "x"}), Contains("unknown rendezvous backend"));

  // torchrun's static backend waits `timeout` (900 s unless given: launcher/api.py) and reads no
  // join_timeout, which c10d reads; c10d's keys are accepted unused (torchrun runs one node with c10d).
  LaunchConfig c = parse({"--rdzv_conf", "timeout=3", "x"});
  CHECK(c.join_timeout == std::chrono::seconds(3));
  CHECK(parse({"--rdzv_conf=timeout=1.5", "x"}).join_timeout == std::chrono::milliseconds(1500));
  CHECK(parse({"--rdzv_conf", "join_timeout=3", "x"}).join_timeout == std::chrono::seconds(900));
  CHECK(parse({"--rdzv_conf=last_call_timeout=3,is_host=1,rank=4", "x"}).join_timeout == std::chrono::seconds(900));
  const ParsedCommandLine two = parse_launch_config({"--nnodes=2", "--rdzv_conf=join_timeout=60", "x"}, fake_host(), no_env);
  REQUIRE(two.notes.size() == 1);
  CHECK_THAT(two.notes[0], Contains("join_timeout is c10d's") && Contains("write timeout=SECONDS"));
  CHECK_THAT(usage_error({"--rdzv_conf=last_cal_timeout=3", "x"}),
             Contains("last_cal_timeout=3") && Contains("timeout=SECONDS") && Contains("join_timeout=SECONDS"));
  CHECK_THAT(usage_error({"--rdzv_conf=timeout=soon", "x"}), Contains("timeout=soon"));
  // A known key without '=' has no value; it is no unknown setting.
  const std::string bare = usage_error({"--rdzv_conf=timeout", "x"});
  CHECK_THAT(bare, Contains("'timeout' has no value; write timeout=VALUE"));
  CHECK_THAT(bare, !Contains("is not a setting"));
  CHECK_THAT(usage_error({"--rdzv_backend=c10d", "--rdzv_conf=join_timeout=5,is_host", "x"}),
             Contains("'is_host' has no value"));
  // Empty items are refused, as torchrun's _parse_rendezvous_config refuses them; an empty --rdzv_conf is none.
  for (const char* conf : {"--rdzv_conf=timeout=5,,", "--rdzv_conf=timeout=5,", "--rdzv_conf=,timeout=5",
                           "--rdzv_conf=timeout=5,,rank=1", "--rdzv_conf=timeout=5, ,rank=1"}) {
    CHECK_THAT(usage_error({conf, "x"}), Contains("an empty item") && Contains("must be in format <key1>=<value1>"));
  }
  CHECK_THAT(usage_error({"--rdzv_conf==5", "x"}), Contains("'=5', an item without a key"));
  CHECK(parse({"--rdzv_conf=", "x"}).join_timeout == std::chrono::seconds(900));
  CHECK(parse({"--rdzv_conf= ", "x"}).join_timeout == std::chrono::seconds(900));
  CHECK_THAT(usage_error({"--rdzv_conf=timeout=0", "x"}), Contains("above 0"));

  c = parse({"--rdzv_endpoint=10.0.0.7:1234", "--master_addr=10.9.9.9", "x"});
  CHECK(c.master_addr == "10.0.0.7");
  CHECK(c.master_port == 1234);
  c = parse({"--rdzv_endpoint=node0", "--master_port=4321", "x"});
  CHECK(c.master_addr == "node0");
  CHECK(c.master_port == 4321);
  c = parse({"--rdzv_endpoint=[fe80::1]:29400", "x"});
  CHECK(c.master_addr == "fe80::1");
  CHECK(c.master_port == 29400);
  CHECK(endpoint_text(c) == "[fe80::1]:29400");
  CHECK_THAT(usage_error({"--rdzv_endpoint=fe80::1:29400", "x"}), Contains("brackets"));
  CHECK_THAT(usage_error({"--rdzv_endpoint=host:99999", "x"}), Contains("99999"));
  CHECK_THAT(usage_error({"--rdzv_endpoint=:29400", "x"}), Contains("--rdzv_endpoint=:29400"));
}

TEST_CASE("launch_config: c10d rendezvous takes MIN:MAX, the endpoint and its settings", "[launch_config]") {
  LaunchConfig c = parse({"--rdzv_backend=c10d", "--rdzv_endpoint=10.0.0.7:1234", "--nnodes=2:4",
                          "--rdzv_id=job9", "--master_addr=10.9.9.9", "--master_port=7", "x"});
  CHECK(c.rdzv_backend == RendezvousBackend::kC10d);
  CHECK(is_multi_node(c));
  CHECK(c.min_nodes == 2);
  CHECK(c.max_nodes == 4);
  CHECK(c.nnodes == 4);
  CHECK(c.master_addr == "10.0.0.7");  // torchrun's c10d ignores --master_addr/--master_port
  CHECK(c.master_port == 1234);
  CHECK(c.run_id == "job9");
  CHECK(c.last_call_timeout == std::chrono::seconds(30));  // torchrun's defaults
  CHECK(c.join_timeout == std::chrono::seconds(600));
  CHECK_FALSE(c.is_host.has_value());

  // N means N:N, and even one node rendezvouses (torchrun does too).
  c = parse({"--rdzv_backend=c10d", "--rdzv_endpoint=node0", "x"});
  CHECK(c.min_nodes == 1);
  CHECK(c.max_nodes == 1);
  CHECK(is_multi_node(c));
  CHECK(c.master_port == 29400);  // torchrun's default c10d port
  c = parse({"--rdzv_backend=c10d", "x"});
  CHECK(c.master_addr == "localhost");
  CHECK(c.master_port == 29400);
  CHECK(parse({"--rdzv_backend=c10d", "--nnodes=3", "x"}).min_nodes == 3);

  // torchrun's documented "--rdzv-endpoint=localhost:0 --nnodes=1: pick a free random port": one
  // node on a port the kernel picks, under the given --rdzv_id; with more nodes, refused.
  c = parse({"--rdzv_backend=c10d", "--rdzv_endpoint=localhost:0", "--nnodes=1", "--rdzv_id=job3", "x"});
  CHECK(c.rdzv_backend == RendezvousBackend::kStatic);
  CHECK_FALSE(is_multi_node(c));
  CHECK(c.picked_port);
  CHECK(c.master_addr == "localhost");
  CHECK(c.master_port == 45678);  // fake_host's free port
  CHECK(c.run_id == "job3");
  CHECK(parse({"--rdzv_backend=c10d", "--rdzv_endpoint=localhost:0", "x"}).picked_port);  // --nnodes defaults to 1
  CHECK_THAT(usage_error({"--rdzv_backend=c10d", "--rdzv_endpoint=localhost:0", "--nnodes=1:2", "x"}),
             Contains("port 0 lets one node pick a free port") && Contains("--nnodes=1:2"));
  CHECK_THAT(usage_error({"--rdzv_backend=c10d", "--rdzv_endpoint=[::1]:0", "--nnodes=2", "x"}),
             Contains("e.g. --rdzv_endpoint=[::1]:29400"));
  CHECK_THAT(usage_error({"--rdzv_endpoint=localhost:0", "x"}), Contains("--rdzv_endpoint port=0"));  // static: refused
  // is_host=0 says another agent hosts; with port 0 nobody could reach it (torchrun: a traceback).
  CHECK_THAT(usage_error({"--rdzv_backend=c10d", "--rdzv_endpoint=localhost:0", "--rdzv_conf=is_host=0", "x"}),
             Contains("is_host=0") && Contains("drop is_host=0"));
  CHECK(parse({"--rdzv_backend=c10d", "--rdzv_endpoint=localhost:0", "--rdzv_conf=is_host=1", "x"}).picked_port);
  // Errors about the meeting host name the flag that gave it (an unresolvable host, node_rendezvous.cpp).
  CHECK(rendezvous_settings(c).host_flag == "the host of --rdzv_endpoint=localhost:0");
  CHECK(parse({"--master_addr=node7", "--master_port=1234", "x"}).master_addr_flag == "--master_addr=node7");
  CHECK(parse({"--master_addr=node7", "--rdzv_endpoint=node8:1234", "x"}).master_addr_flag ==
        "the host of --rdzv_endpoint=node8:1234");
  CHECK(parse({"--rdzv_backend=c10d", "x"}).master_addr_flag ==
        "the host of the default --rdzv_endpoint=localhost:29400");

  // --node_rank means nothing to c10d (nodes are numbered as they join): ignored, like torchrun.
  CHECK(parse({"--rdzv_backend=c10d", "--nnodes=1:2", "--node_rank=5", "x"}).node_rank == 0);
  CHECK_THAT(usage_error({"--rdzv_backend=c10d", "--node_rank=x", "x"}), Contains("--node_rank=x"));

  c = parse({"--rdzv_backend=c10d", "--rdzv_conf", "join_timeout=5,last_call_timeout=0.5,is_host=1,read_timeout=60",
             "x"});
  CHECK(c.join_timeout == std::chrono::seconds(5));
  CHECK(c.last_call_timeout == std::chrono::milliseconds(500));
  REQUIRE(c.is_host.has_value());
  CHECK(*c.is_host);
  CHECK_FALSE(*parse({"--rdzv_backend=c10d", "--rdzv_conf=is_host=false", "x"}).is_host);
  // torchrun's RendezvousTimeout: the join, last-call, close and heartbeat timeouts must be positive.
  for (const char* key : {"last_call_timeout", "close_timeout", "heartbeat_timeout"}) {
    CHECK_THAT(usage_error({"--rdzv_backend=c10d", std::string("--rdzv_conf=") + key + "=0", "x"}),
               Contains("must be above 0 seconds"));
  }
  // torchrun's _try_parse_port: 1 to 5 digits, nothing else.
  for (const char* endpoint : {"h:29_711", "h:+29711", "h: 29711", "h:029711"}) {
    CHECK_THAT(usage_error({"--rdzv_backend=c10d", std::string("--rdzv_endpoint=") + endpoint, "x"}),
               Contains("1 to 5 digits"));
  }
  CHECK_THAT(usage_error({"--rdzv_backend=c10d", "--rdzv_conf=is_host=maybe", "x"}), Contains("is_host=maybe"));
  CHECK_THAT(usage_error({"--rdzv_backend=c10d", "--rdzv_conf=last_call_timeout=-1", "x"}),
             Contains("last_call_timeout=-1"));
  CHECK_THAT(usage_error({"--rdzv_backend=c10d", "--rdzv_conf=keep_alive=3", "x"}),
             Contains("'keep_alive=3' is not a setting of c10d rendezvous") && Contains("last_call_timeout"));

  // Every key torchrun 2.15's c10d reads (dynamic_rendezvous.py, c10d_rendezvous_backend.py), checked
  // as torchrun checks it; c10d ignores `timeout` (static's), which is said.
  c = parse({"--rdzv_backend=c10d", "--rdzv_conf=heartbeat_timeout=30,cas_backoff_max_seconds=0.5,close_timeout=5,"
             "keep_alive_interval=5,keep_alive_max_attempt=3,read_timeout=60,store_type=TCP,join_timeout=7", "x"});
  CHECK(c.join_timeout == std::chrono::seconds(7));
  CHECK(parse({"--rdzv_backend=c10d", "x"}).join_timeout == std::chrono::seconds(600));
  const ParsedCommandLine c10d_timeout =
      parse_launch_config({"--rdzv_backend=c10d", "--rdzv_conf=timeout=5", "x"}, fake_host(), no_env);
  CHECK(c10d_timeout.config.join_timeout == std::chrono::seconds(600));
  REQUIRE(c10d_timeout.notes.size() == 1);
  CHECK_THAT(c10d_timeout.notes[0], Contains("c10d's is join_timeout") && Contains("timeout is ignored"));
  CHECK(parse_launch_config({"--rdzv_backend=c10d", "--rdzv_conf=timeout=5,join_timeout=5", "x"}, fake_host(), no_env)
            .notes.empty());
  const ParsedCommandLine heartbeat =
      parse_launch_config({"--rdzv_backend=c10d", "--rdzv_conf=heartbeat=5", "x"}, fake_host(), no_env);
  REQUIRE(heartbeat.notes.size() == 1);
  CHECK_THAT(heartbeat.notes[0], Contains("heartbeat_timeout, not heartbeat"));
  CHECK_THAT(usage_error({"--rdzv_backend=c10d", "--rdzv_conf=cas_backoff_max_seconds=-1", "x"}),
             Contains("cas_backoff_max_seconds=-1"));
  CHECK_THAT(usage_error({"--rdzv_backend=c10d", "--rdzv_conf=cas_backoff_max_seconds=inf", "x"}),
             Contains("cas_backoff_max_seconds=inf"));
  CHECK_THAT(usage_error({"--rdzv_backend=c10d", "--rdzv_conf=keep_alive_max_attempt=x", "x"}),
             Contains("keep_alive_max_attempt=x"));
  CHECK_THAT(usage_error({"--rdzv_backend=c10d", "--rdzv_conf=read_timeout=0", "x"}), Contains("read timeout"));
  CHECK_THAT(usage_error({"--rdzv_backend=c10d", "--rdzv_conf=store_type=redis", "x"}), Contains("tcp or file"));
  CHECK_THAT(usage_error({"--rdzv_backend=c10d", "--rdzv_conf=store_type=file", "x"}), Contains("not implemented"));

  // --standalone keeps its meaning (one node, a private port), whatever backend was asked for.
  c = parse({"--standalone", "--rdzv_backend=c10d", "x"});
  CHECK(c.rdzv_backend == RendezvousBackend::kStatic);
  CHECK(c.master_port == 45678);
  CHECK_THAT(usage_error({"--standalone", "--rdzv_backend=c10d", "--nnodes=1:2", "x"}), Contains("--standalone"));
}

TEST_CASE("launch_config: --log_dir=/dev/null shows every rank and refuses filters that need files", "[launch_config]") {
  // torchrun's DefaultLogsSpecs.reify: its devnull branch applies no --local_ranks_filter.
  const LaunchConfig c = parse({"--log_dir=/dev/null", "--local_ranks_filter=0", "--nproc_per_node=2", "x"});
  CHECK(c.output.shown == std::vector<bool>{true, true});
  CHECK_THAT(usage_error({"--log_dir=/dev/null", "--duplicate_stdout_filters=loss", "x"}),
             Contains("--log_dir=/dev/null writes no files"));
}

TEST_CASE("launch_config: long options may be shortened to an unambiguous prefix, like argparse",
          "[launch_config]") {
  LaunchConfig c = parse({"--nproc", "3", "--max_rest=2", "--rdzv_b", "c10d", "--rdzv_e=h:5", "--nn", "1:2",
                          "--rdzv_i", "j", "./train", "--nproc", "9", "--max"});
  CHECK(c.nproc_per_node == 3);
  CHECK(c.max_restarts == 2);
  CHECK(c.rdzv_backend == RendezvousBackend::kC10d);
  CHECK(c.master_addr == "h");
  CHECK(c.max_nodes == 2);
  CHECK(c.run_id == "j");
  CHECK(c.program == "./train");
  CHECK(c.program_args == std::vector<std::string>{"--nproc", "9", "--max"});  // PROGRAM's, untouched
  CHECK(parse({"--nproc-per", "2", "x"}).nproc_per_node == 2);
  CHECK(parse({"--stand", "x"}).standalone);
  CHECK(parse({"--dry", "x"}).dry_run);
  CHECK(parse({"--tee=1", "--log_d", "d", "x"}).output.log_dir == "d");
  CHECK_THAT(usage_error({"--rdzv", "x", "y"}),
             Contains("ambiguous option --rdzv: it could be --rdzv_backend, --rdzv_endpoint, --rdzv_conf, --rdzv_id"));
  CHECK_THAT(usage_error({"--ma=1", "x"}), Contains("ambiguous option --ma") && Contains("--master_addr") &&
                                                Contains("--master_port") && Contains("--max_restarts"));
  CHECK_THAT(cli_help({"--he"}), Contains("PROGRAM [ARGS...]"));
}

TEST_CASE("launch_config: bad values name the flag and the value", "[launch_config]") {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--nproc_per_node=0", "x"}, "--nproc_per_node=0"},
      {{"--nproc_per_node=-2", "x"}, "--nproc_per_node=-2"},
      {{"--nproc_per_node=two", "x"}, "--nproc_per_node=two"},
      {{"--nproc_per_node=2x", "x"}, "--nproc_per_node=2x"},
      {{"--nproc_per_node", "", "x"}, "--nproc_per_node=''"},
      {{"--master_port=0", "x"}, "--master_port=0"},
      {{"--master_port=65536", "x"}, "--master_port=65536"},
      {{"--master-port=http", "x"}, "--master_port=http"},
      {{"--master_addr", "", "x"}, "--master_addr=''"},
      {{"--node_rank=1", "x"}, "--node_rank=1"},
      {{"--max_restarts=-1", "x"}, "--max_restarts=-1"},
      {{"--shutdown_timeout=-1", "x"}, "--shutdown_timeout=-1"},
      {{"--shutdown_timeout=5s", "x"}, "--shutdown_timeout=5s"},
      {{"--monitor_interval=often", "x"}, "--monitor_interval=often"},
      {{"--monitor_interval=0", "x"}, "--monitor_interval=0"},  // torchrun asserts > 0
      {{"--monitor_interval=-1", "x"}, "--monitor_interval=-1"},
  };
  for (const auto& [args, expected] : cases) {
    INFO(args.front());
    CHECK_THAT(usage_error(args), Contains(expected) && Contains("expected"));
  }
  CHECK_THAT(usage_error({"--master_port=65536", "x"}), Contains("1 to 65535"));
}

TEST_CASE("launch_config: whole numbers are read as Python's int() reads them, as torchrun's", "[launch_config]") {
  // torchrun's type=int options and its int(nproc_per_node): whitespace around, a sign, underscores.
  CHECK(parse({"--nproc_per_node=2 ", "x"}).nproc_per_node == 2);
  CHECK(parse({"--nproc_per_node=\t3\n", "x"}).nproc_per_node == 3);
  CHECK(parse({"--nproc_per_node=+4", "x"}).nproc_per_node == 4);
  CHECK(parse({"--master_port=29692 ", "x"}).master_port == 29692);
  CHECK(parse({"--master_port=29_500", "x"}).master_port == 29500);
  CHECK(parse({"--max_restarts= 2 ", "x"}).max_restarts == 2);
  CHECK(parse({"--nnodes=2 ", "--node_rank=1 ", "--master_port=1", "x"}).node_rank == 1);
  CHECK(int_in_range("0_1", 0, 9) == 1);
  for (const std::string bad : {"2 2", "_2", "2_", "2__0", "+", "-", " ", "2.0", "0x10", "+-2", "2_ 0"}) {
    INFO("'" << bad << "'");
    CHECK_FALSE(int_in_range(bad, -100, 100).has_value());
  }
}

TEST_CASE("launch_config: prefixes torchrun reads as one of its options are that option, beside cpprun's own",
          "[launch_config]") {
  // --re: torchrun's --redirects (cpprun also has --restart_backoff); --run_/--run-: --run_path (cpprun's
  // --run_id alias); --no-/--no_: --no_python (cpprun's --no_job_secret).
  CHECK(parse({"--re=3", "--log_dir=/tmp/x", "./train"}).output.redirects.at(0) == StdStreams::kAll);
  CHECK(parse({"--run_", "train.py"}).program_mode == ProgramMode::kRunPath);
  CHECK(parse({"--run-", "train.py"}).program_mode == ProgramMode::kRunPath);
  CHECK(parse({"--no-", "./train"}).program_mode == ProgramMode::kNoPython);
  CHECK(parse({"--no_", "./train"}).program_mode == ProgramMode::kNoPython);
  CHECK(parse({"--run_i=job4", "--master_port=29500", "./train"}).run_id == "job4");
  CHECK(parse({"--rest=2", "./train"}).restart_backoff.initial == std::chrono::seconds(2));
  CHECK(parse({"--dry", "./train"}).dry_run);
  CHECK_THAT(usage_error({"--r=1", "./train"}), Contains("ambiguous option --r"));
}

TEST_CASE("launch_config: unknown options and a missing PROGRAM are usage errors", "[launch_config]") {
  CHECK_THAT(usage_error({"--bogus", "./train"}), Contains("unknown option --bogus"));
  CHECK_THAT(usage_error({"--bogus=3", "./train"}), Contains("unknown option --bogus"));
  CHECK_THAT(usage_error({"--nproc_per_node=2"}), Contains("missing PROGRAM"));
  CHECK_THAT(usage_error({}), Contains("missing PROGRAM"));
  CHECK_THAT(usage_error({"--nproc_per_node"}), Contains("--nproc_per_node expects a value (N, auto, cpu or gpu)"));
  CHECK_THAT(usage_error({"--nnodes"}), Contains("--nnodes expects a value (N or MIN:MAX)") && Contains("--help"));
  // A flag given a value: said as such, not CLI11's "Could not convert: --run_path = train.py".
  for (const char* flag : {"--run_path=train.py", "--standalone=abc", "--no_python=x", "--no-python=1"}) {
    const std::string text = usage_error({flag, "x"});
    CHECK_THAT(text, Contains("is a flag and takes no value"));
    CHECK_THAT(text, !Contains("Could not convert"));
  }
}

TEST_CASE("launch_config: --standalone takes 127.0.0.1, a free port and a random run id", "[launch_config]") {
  const LaunchConfig c = parse({"--standalone", "--master_addr=10.1.1.1", "--master_port=1", "--rdzv_id=mine", "x"});
  CHECK(c.standalone);
  CHECK(c.master_addr == "127.0.0.1");
  CHECK(c.master_port == 45678);
  CHECK(c.run_id == "11111111-2222-4333-8444-555555555555");  // torchrun replaces --rdzv_id too

  HostFacts real = fake_host();
  real.pick_free_port = [] { return pick_free_port(); };
  const int port = parse({"--standalone", "x"}, real).master_port;
  CHECK(port >= 1);
  CHECK(port <= 65535);
}

TEST_CASE("launch_config: --help comes from CLI11 and lists both spellings", "[launch_config]") {
  const ParsedCommandLine cli = parse_launch_config({"--help"}, fake_host());
  REQUIRE(cli.outcome == CliOutcome::kShowHelp);
  CHECK_THAT(cli.help_text, Contains("PROGRAM [ARGS...]"));
  CHECK_THAT(cli.help_text, Contains("--nproc_per_node,--nproc-per-node"));
  CHECK_THAT(cli.help_text, Contains("--max_restarts,--max-restarts"));
  // After PROGRAM, --help belongs to the program.
  CHECK(parse({"./train", "--help"}).program_args == std::vector<std::string>{"--help"});
}

TEST_CASE("launch_config: --redirects, --tee, --log_dir and --local_ranks_filter", "[launch_config]") {
  const LaunchConfig c = parse({"--nproc_per_node=3", "-r", "0:1,2:3", "--tee=2", "--log_dir", "logs",
                                "--local_ranks_filter=0,2", "x"});
  using S = StdStreams;
  CHECK(c.output.redirects == std::vector<S>{S::kOut, S::kNone, S::kAll});
  CHECK(c.output.tee == std::vector<S>{S::kErr, S::kErr, S::kErr});
  CHECK(c.output.shown == std::vector<bool>{true, false, true});
  CHECK(c.output.log_dir == "logs");
  CHECK(parse({"-t", "1", "--log-dir=d", "x"}).output.tee == std::vector<S>{S::kOut});
  CHECK(parse({"--redirects=3", "--log_dir=d", "x"}).output.redirects == std::vector<S>{S::kAll});
  CHECK(parse({"--local-ranks-filter=0", "x"}).output.shown == std::vector<bool>{true});
  // Defaults: everything to the console, no files, so no --log_dir needed.
  const LaunchConfig d = parse({"--nproc_per_node=2", "x"});
  CHECK(d.output.redirects == std::vector<S>{S::kNone, S::kNone});
  CHECK(d.output.shown == std::vector<bool>{true, true});
  CHECK_FALSE(d.output.writes_files());
}

TEST_CASE("launch_config: files without --log_dir go to a temp dir; bad output values are usage errors",
          "[launch_config]") {
  // As torchrun: a temp log dir (run_directory.h), not an error.
  const LaunchConfig files = parse({"--redirects=3", "x"});
  CHECK(files.output.writes_files());
  CHECK(files.output.log_dir.empty());
  CHECK(parse({"--nproc_per_node=2", "--tee", "1:1", "x"}).output.writes_files());
  CHECK_THAT(usage_error({"--redirects=5", "--log_dir=d", "x"}), Contains("--redirects=5"));
  CHECK_THAT(usage_error({"--nproc_per_node=2", "--local_ranks_filter=2", "x"}),
             Contains("--local_ranks_filter=2"));
  // --redirects 0 writes nothing, so it needs no --log_dir.
  CHECK(parse({"--redirects=0", "--tee=0:0", "x"}).output.log_dir.empty());
}

TEST_CASE("launch_config: --dry_run", "[launch_config]") {
  CHECK(parse({"--dry_run", "x"}).dry_run);
  CHECK(parse({"--dry-run", "x"}).dry_run);
  CHECK_FALSE(parse({"x"}).dry_run);
}

TEST_CASE("launch_config: torchrun's --no_python, -m and --run_path choose how PROGRAM runs", "[launch_config]") {
  CHECK(parse({"train.py"}).program_mode == ProgramMode::kByName);
  CHECK(parse({"--no_python", "train.py"}).program_mode == ProgramMode::kNoPython);
  const LaunchConfig module = parse({"-m", "pkg.train", "--lr", "1"});
  CHECK(module.program_mode == ProgramMode::kModule);
  CHECK(module.program == "pkg.train");
  CHECK(module.program_args == std::vector<std::string>{"--lr", "1"});
  CHECK(parse({"--module", "pkg"}).program_mode == ProgramMode::kModule);
  CHECK(parse({"--run_path", "train.py"}).program_mode == ProgramMode::kRunPath);
  CHECK(parse({"--run-path", "train.py"}).program_mode == ProgramMode::kRunPath);
  CHECK_THAT(usage_error({"--no_python", "-m", "pkg"}), Contains("--no_python and -m/--module contradict"));
  // torchrun's config_from_args looks at --run_path first: it wins over -m and --no_python.
  CHECK(parse({"--run_path", "-m", "pkg"}).program_mode == ProgramMode::kRunPath);
  CHECK(parse({"--run_path", "--no_python", "x"}).program_mode == ProgramMode::kRunPath);
  CHECK(parse({"--no_python", "-m", "--run_path", "x"}).program_mode == ProgramMode::kRunPath);
  // After PROGRAM, -m belongs to the program.
  CHECK(parse({"python3", "-m", "pkg"}).program_args == std::vector<std::string>{"-m", "pkg"});
}

TEST_CASE("launch_config: unknown options get a suggestion when one is close", "[launch_config]") {
  CHECK_THAT(usage_error({"--nproc_pre_node=2", "x"}),
             Contains("unknown option --nproc_pre_node; did you mean --nproc_per_node?"));
  CHECK_THAT(usage_error({"--nnode_s", "1", "x"}), Contains("did you mean --nnodes?"));
  CHECK_THAT(usage_error({"--log-dirs=x", "y"}), Contains("did you mean --log-dir?"));
  CHECK_THAT(usage_error({"--dryrun", "x"}), Contains("did you mean --dry_run?"));
  CHECK(usage_error({"--bogus", "x"}).find("did you mean") == std::string::npos);
}

TEST_CASE("launch_config: a multi-node job needs a job secret, from the environment or a file",
          "[launch_config]") {
  const auto parse_with = [](const std::vector<std::string>& args, std::optional<std::string> secret) {
    return parse_launch_config(args, fake_host(), [secret](const std::string& name) -> std::optional<std::string> {
             if (name == "CPPRUN_JOB_SECRET") return secret;
             return std::nullopt;
           }).config;
  };
  const auto error_with = [&](const std::vector<std::string>& args, std::optional<std::string> secret) {
    return usage_error_text([&] { parse_with(args, std::move(secret)); });
  };
  CHECK(parse({"--nnodes=2", "--node_rank=1", "x"}).job_secret == kSecret);
  CHECK(parse_with({"x"}, std::nullopt).job_secret.empty());  // one node: no agent listens
  // Refused where the agents may be on other hosts; on the loopback, or with one agent, see test_host_secret.cpp.
  CHECK_THAT(error_with({"--nnodes=2", "--master_addr=10.0.0.1", "x"}, std::nullopt),
             Contains("needs a job secret") && Contains("CPPRUN_JOB_SECRET") && Contains("--no_job_secret"));
  CHECK_THAT(error_with({"--rdzv_backend=c10d", "--nnodes=1:2", "--rdzv_endpoint=node01:29400", "x"}, std::nullopt),
             Contains("needs a job secret"));
  CHECK(parse_with({"--rdzv_backend=c10d", "--nnodes=1", "--rdzv_endpoint=node01:29400", "x"}, std::nullopt)
            .job_secret.size() == 64);  // one agent: its own
  CHECK_THAT(error_with({"--nnodes=2", "x"}, std::string("short")),
             Contains("CPPRUN_JOB_SECRET holds a secret of 5 characters; it needs at least 16"));
  const LaunchConfig open = parse_with({"--nnodes=2", "--master_addr=10.0.0.1", "--no_job_secret", "x"}, std::nullopt);
  CHECK(open.no_job_secret);
  CHECK(open.job_secret.empty());

  const std::string file = std::string(std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp") +
                           "/cpprun-test-secret-" + std::to_string(::getpid());
  {
    std::ofstream out(file);
    out << "from a file, long enough\n";
  }
  CHECK(parse_with({"--nnodes=2", "--job_secret_file", file, "x"}, kSecret).job_secret == "from a file, long enough");
  CHECK_THAT(error_with({"--nnodes=2", "--job_secret_file", file, "--no_job_secret", "x"}, std::nullopt),
             Contains("contradict"));
  std::remove(file.c_str());
  CHECK_THAT(error_with({"--nnodes=2", "--job_secret_file", file, "x"}, std::nullopt),
             Contains("--job_secret_file=" + file + ": cannot read it"));
}

TEST_CASE("launch_config: --restart_backoff takes INITIAL[:MAX] seconds", "[launch_config]") {
  using std::chrono::milliseconds;
  const LaunchConfig defaults = parse({"x"});
  CHECK(defaults.restart_backoff.initial == milliseconds(1000));
  CHECK(defaults.restart_backoff.max == milliseconds(30000));
  const LaunchConfig both = parse({"--restart_backoff=0.25:4", "x"});
  CHECK(both.restart_backoff.initial == milliseconds(250));
  CHECK(both.restart_backoff.max == milliseconds(4000));
  // INITIAL alone keeps the 30 s cap, or is a fixed wait when longer.
  CHECK(parse({"--restart-backoff", "2", "x"}).restart_backoff.max == milliseconds(30000));
  const LaunchConfig fixed = parse({"--restart_backoff=45", "x"});
  CHECK(fixed.restart_backoff.initial == milliseconds(45000));
  CHECK(fixed.restart_backoff.max == milliseconds(45000));
  CHECK(parse({"--restart_backoff=0", "x"}).restart_backoff.initial == milliseconds(0));
  CHECK_THAT(cli_help({"--help"}), Contains("--restart_backoff,--restart-backoff"));
}

TEST_CASE("launch_config: a bad --restart_backoff says what it expects", "[launch_config]") {
  for (const char* bad : {"--restart_backoff=fast", "--restart_backoff=1:", "--restart_backoff=-1",
                          "--restart_backoff=1:2:3", "--restart_backoff=1s", "--restart_backoff=90000"}) {
    INFO(bad);
    CHECK_THAT(usage_error({bad, "x"}), Contains(bad) && Contains("expected INITIAL[:MAX]"));
  }
  CHECK_THAT(usage_error({"--restart_backoff=10:2", "x"}),
             Contains("--restart_backoff=10:2: MAX is below INITIAL; write --restart_backoff=2:10"));
}

TEST_CASE("launch_config: torchrun's options cpprun cannot honour are accepted, checked like torchrun's",
          "[launch_config]") {
  for (const std::string method : {"spawn", "fork", "forkserver"}) {
    CHECK(parse({"--start_method=" + method, "x"}).program == "x");
    CHECK(parse({"--start-method", method, "x"}).program == "x");
  }
  CHECK_THAT(usage_error({"--start_method=thread", "x"}),
             Contains("--start_method=thread") && Contains("spawn, fork, forkserver"));
  CHECK(parse({"--local_addr=10.0.0.1", "--event-log-handler=null", "x"}).program == "x");
  CHECK_THAT(usage_error({"--numa_binding=everywhere", "x"}), Contains("node, socket, exclusive, core-complex"));
  CHECK(parse({"--signals_to_handle=SIGTERM,SIGUSR1", "x"}).signals_to_handle == "SIGTERM,SIGUSR1");
  // torchrun warns of a name that is not a signal's and runs: a note here, not a usage error.
  const ParsedCommandLine odd = parse_launch_config({"--signals_to_handle=SIGTERM,SIGFOO", "x"}, fake_host(), no_env);
  REQUIRE(odd.notes.size() == 1);
  CHECK_THAT(odd.notes[0], Contains("'SIGFOO' is not a signal name") && Contains("ignored, as torchrun"));
  // A real signal cpprun does not catch is no "not a signal name": it is exported, and the note says what
  // cpprun does with it where torchrun's agent would end the job on it.
  const ParsedCommandLine winch =
      parse_launch_config({"--signals_to_handle=SIGTERM,SIGWINCH", "x"}, fake_host(), no_env);
  REQUIRE(winch.notes.size() == 1);
  CHECK(winch.config.signals_to_handle == "SIGTERM,SIGWINCH");
  CHECK_THAT(winch.notes[0], !Contains("not a signal name"));
  CHECK_THAT(winch.notes[0], Contains("SIGWINCH is exported in TORCHELASTIC_SIGNALS_TO_HANDLE but not caught") &&
                                 Contains("torchrun's agent would end the job on it"));
  for (const char* listed : {"SIGALRM", "SIGPIPE", "SIGRTMIN", "SIGCHLD"}) {
    const ParsedCommandLine other = parse_launch_config({std::string("--signals_to_handle=") + listed, "x"},
                                                        fake_host(), no_env);
    REQUIRE(other.notes.size() == 1);
    CHECK_THAT(other.notes[0], Contains(std::string(listed) + " is exported"));
  }
  CHECK(parse_launch_config({"--signals_to_handle=SIGINT, SIGHUP,SIGQUIT,SIGUSR2", "x"}, fake_host(), no_env)
            .notes.empty());
  // Uncatchable: torchrun fails starting its workers (OSError); refused here.
  CHECK_THAT(usage_error({"--signals_to_handle=SIGTERM,SIGKILL", "x"}),
             Contains("SIGKILL cannot be caught by any process") && Contains("drop it"));
  CHECK_THAT(usage_error({"--signals_to_handle=SIGSTOP", "x"}), Contains("SIGSTOP cannot be caught"));
  // Those asking for something cpprun does not do say so, once, on stderr.
  const ParsedCommandLine quiet = parse_launch_config({"--start_method=fork", "x"}, fake_host(), no_env);
  CHECK(quiet.notes.empty());
  const ParsedCommandLine noisy =
      parse_launch_config({"--numa-binding=node", "--logs_specs=default", "--duplicate_stdout_filters=a,b",
                           "--event_log_handler=console", "x"},
                          fake_host(), no_env);
  REQUIRE(noisy.notes.size() == 2);  // --duplicate_stdout_filters is implemented, --logs_specs=default is torchrun's own
  CHECK_THAT(noisy.notes[0], Contains("--numa_binding=node") && Contains("ignored"));
  CHECK_THAT(noisy.notes[1], Contains("--event_log_handler=console"));
  // --logs_specs: torchrun's entry point "default" only; any other name, or none, is refused as torchrun refuses it.
  CHECK(parse({"--logs-specs", "default", "x"}).program == "x");
  CHECK_THAT(usage_error({"--logs_specs=mine", "x"}),
             Contains("--logs_specs=mine: not a LogsSpecs entry point") && Contains("--logs_specs=default") &&
                 Contains("'torchrun.logs_specs[mine]'"));
  CHECK_THAT(usage_error({"--logs_specs", "", "x"}), Contains("--logs_specs='': not a LogsSpecs entry point"));
  // torchrun's comma_separated_list: ",," is a comma; filters mean files (a log dir, a temp one if need be).
  const LaunchConfig filters = parse({"--duplicate-stdout-filters=apple,,pie,orange", "--tee=1", "x"});
  CHECK(filters.output.duplicate_stdout_filters == std::vector<std::string>{"apple,pie", "orange"});
  CHECK(filters.output.duplicate_stderr_filters.empty());
  CHECK(parse({"--duplicate_stderr_filters=E", "x"}).output.writes_files());
}

TEST_CASE("launch_config: PET_<NAME> only for the options torchrun reads it for", "[launch_config]") {
  // run.py gives --logs_specs, --numa_binding and --print_completion no env action: their PET_
  // variables are not read; the others' are. CLI11 reads them from the process's environment.
  const std::vector<std::pair<const char*, const char*>> vars = {
      {"PET_LOGS_SPECS", "bogus"}, {"PET_NUMA_BINDING", "bogus"}, {"PET_PRINT_COMPLETION", "bash"},
      {"PET_NPROC_PER_NODE", "3"}};
  for (const auto& [name, value] : vars) setenv(name, value, 1);
  const ParsedCommandLine cli = parse_launch_config({"x"}, fake_host(), no_env);
  for (const auto& [name, value] : vars) unsetenv(name);
  REQUIRE(cli.outcome == CliOutcome::kLaunch);
  CHECK(cli.config.nproc_per_node == 3);
  CHECK(cli.notes.empty());
}

TEST_CASE("launch_config: a flag's PET_<NAME> is torchrun's bool(int(value))", "[launch_config]") {
  // Note [A flag from PET_<NAME>]: argparse_util.check_env, so -1 is on; CLI11 read it as off.
  const auto with = [](const std::string& name, const std::string& value) {
    return [name, value](const std::string& asked) -> std::optional<std::string> {
      return asked == name ? std::optional<std::string>(value) : no_env(asked);
    };
  };
  const auto mode = [&](const std::string& value) {
    return parse_launch_config({"train.py"}, fake_host(), with("PET_NO_PYTHON", value)).config.program_mode;
  };
  for (const char* on : {"1", "-1", "2", " 3\n", "+1", "1_0", "007", "true", "Yes", "ON", "t", "enable"}) {
    INFO("PET_NO_PYTHON='" << on << "'");
    CHECK(mode(on) == ProgramMode::kNoPython);
  }
  for (const char* off : {"0", "-0", "0_0", " 0 ", "false", "no", "Off", "", "N", "disable"}) {
    INFO("PET_NO_PYTHON='" << off << "'");
    CHECK(mode(off) == ProgramMode::kByName);
  }
  for (const char* bad : {"abc", "1.0", "_1", "1_", "1__0", "-", "0x1", "1 1"}) {
    INFO("PET_NO_PYTHON='" << bad << "'");
    CHECK_THAT(usage_error_text([&] { mode(bad); }),
               Contains(std::string("PET_NO_PYTHON=") + bad + ": expected an integer"));
  }
  // The command line wins: the variable is not read, even when it is bad.
  CHECK(parse_launch_config({"--no_python", "t"}, fake_host(), with("PET_NO_PYTHON", "abc")).config.program_mode ==
        ProgramMode::kNoPython);
  CHECK(parse_launch_config({"t"}, fake_host(), with("PET_STANDALONE", "-1")).config.standalone);
  CHECK(parse_launch_config({"t"}, fake_host(), with("PET_DRY_RUN", "1")).config.dry_run);
  // --help still names each flag's variable.
  CHECK_THAT(cli_help({"--help"}), Contains("--standalone (Env:PET_STANDALONE)"));
  CHECK_THAT(cli_help({"--help"}), Contains("(Env:PET_NO_PYTHON)"));
}

TEST_CASE("launch_config: --rdzv_conf as PyTorch's own tests quote it", "[launch_config]") {
  // One argv word with the quotes in it: test/distributed/launcher/run_test.py.
  const LaunchConfig c = parse({"--rdzv-backend=c10d", "--rdzv-endpoint=localhost:29400", "--nnodes=1:2",
                                "--rdzv-conf='join_timeout=5,last_call_timeout=1,timeout=5'", "x"});
  CHECK(c.join_timeout == std::chrono::seconds(5));
  CHECK(c.last_call_timeout == std::chrono::seconds(1));
  CHECK(parse({"--rdzv_conf=\" timeout = 7 \"", "x"}).join_timeout == std::chrono::seconds(7));
  // c10d's settings of a store-based agent are accepted and unused.
  CHECK(parse({"--rdzv_backend=c10d", "--rdzv_conf=read_timeout=60,keep_alive_max_attempt=3,store_type=tcp", "x"})
            .join_timeout == std::chrono::seconds(600));
  CHECK_THAT(usage_error({"--rdzv_conf=join_timeout=", "x"}), Contains("has no value"));
}

TEST_CASE("launch_config: one node without --master_port takes a free port and a random run id, as torchrun 2.x",
          "[launch_config]") {
  const std::string random = "11111111-2222-4333-8444-555555555555";
  LaunchConfig c = parse({"--nproc_per_node=2", "--rdzv_id=mine", "x"});
  CHECK(c.picked_port);
  CHECK(c.master_port == 45678);
  CHECK(c.run_id == random);  // torchrun replaces --rdzv_id too
  // --master_port (even 29500, even as PET_MASTER_PORT) keeps the static backend's port and run id.
  c = parse({"--master_port=29500", "--rdzv_id=mine", "x"});
  CHECK_FALSE(c.picked_port);
  CHECK(c.master_port == 29500);
  CHECK(c.run_id == "mine");
  setenv("PET_MASTER_PORT", "29600", 1);  // CLI11 reads PET_<NAME> from the real environment
  c = parse({"x"});
  unsetenv("PET_MASTER_PORT");
  CHECK(c.master_port == 29600);
  CHECK_FALSE(c.picked_port);
  // --rdzv_endpoint gives the port; several nodes never pick one.
  CHECK(parse({"--rdzv_endpoint=127.0.0.1:29700", "x"}).master_port == 29700);
  CHECK(parse({"--nnodes=2", "--node_rank=1", "x"}).master_port == 29500);
  CHECK(parse({"--nnodes=2", "--node_rank=1", "x"}).run_id == "none");
  // A given --master_addr stays; torchrun's bracketed IPv6 form loses its brackets.
  CHECK(parse({"--master_addr=::1", "x"}).master_addr == "::1");
  CHECK(parse({"--master_addr=[0:0:0:0:0:0:0:1]", "--master_port=29500", "x"}).master_addr == "0:0:0:0:0:0:0:1");
}

TEST_CASE("launch_config: TORCH_ELASTIC_SHUTDOWN_TIMEOUT and TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE",
          "[launch_config]") {
  const auto env = [](const std::string& name) -> std::optional<std::string> {
    if (name == "TORCH_ELASTIC_SHUTDOWN_TIMEOUT") return std::string("12");
    if (name == "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE") return std::string("[${rank}] ");
    return std::nullopt;
  };
  LaunchConfig c = parse_launch_config({"x"}, fake_host(), env).config;
  CHECK(c.shutdown_timeout == std::chrono::seconds(12));
  CHECK(c.log_line_prefix_template == "[${rank}] ");
  c = parse_launch_config({"--shutdown_timeout=2", "--log_line_prefix_template=${hostname}: ", "x"}, fake_host(), env)
          .config;
  CHECK(c.shutdown_timeout == std::chrono::seconds(2));  // the flag wins
  CHECK(c.log_line_prefix_template == "${hostname}: ");
  CHECK(c.hostname == "node7");
  const auto bad = [](const std::string& name) -> std::optional<std::string> {
    if (name == "TORCH_ELASTIC_SHUTDOWN_TIMEOUT") return std::string("soon");
    return std::nullopt;
  };
  CHECK_THAT(usage_error_text([&] { parse_launch_config({"x"}, fake_host(), bad); }),
             Contains("TORCH_ELASTIC_SHUTDOWN_TIMEOUT=soon"));
}

TEST_CASE("launch_config: TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT, checked every --monitor_interval",
          "[launch_config]") {
  const auto with = [](const std::optional<std::string>& value) {
    return [value](const std::string& name) -> std::optional<std::string> {
      return name == "TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT" ? value : std::nullopt;
    };
  };
  const LaunchConfig off = parse_launch_config({"x"}, fake_host(), with(std::nullopt)).config;
  CHECK_FALSE(off.uninterruptible_state.enabled());
  CHECK(off.uninterruptible_state.interval == std::chrono::milliseconds(100));  // torchrun's 0.1 s
  const LaunchConfig on =
      parse_launch_config({"--monitor_interval=0.25", "x"}, fake_host(), with(std::string("30"))).config;
  CHECK(on.uninterruptible_state.timeout_s == 30);
  CHECK(on.uninterruptible_state.interval == std::chrono::milliseconds(250));
  CHECK(parse_launch_config({"x"}, fake_host(), with(std::nullopt)).notes.empty());
  CHECK(parse_launch_config({"x"}, fake_host(), with(std::string("30"))).notes.empty());
  // Not a positive number: off, and no usage error (torchrun ignores it too), but one note says so.
  for (const std::string value : {"soon", "0", "-3"}) {
    const ParsedCommandLine ignored = parse_launch_config({"x"}, fake_host(), with(value));
    CHECK_FALSE(ignored.config.uninterruptible_state.enabled());
    REQUIRE(ignored.notes.size() == 1);
    CHECK(ignored.notes[0] == "cpprun: TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT='" + value +
                                  "' is not a number of seconds above 0: the D-state check is off, as torchrun "
                                  "leaves it (set e.g. 600, or unset it)");
  }
  CHECK(parse_launch_config({"x"}, fake_host(), with(std::string(""))).notes.empty());  // empty: unset
}

TEST_CASE("launch_config: TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 as torchrun's c10d handler reads it, one node",
          "[launch_config]") {
  const auto env = [](const std::string& name) -> std::optional<std::string> {
    if (name == "TORCH_DISABLE_SHARE_RDZV_TCP_STORE") return std::string("1");
    if (name == "CPPRUN_JOB_SECRET") return std::string(kSecret);
    return std::nullopt;
  };
  const auto parsed = [&](const std::vector<std::string>& args) { return parse_launch_config(args, fake_host(), env); };
  CHECK_FALSE(parsed({"x"}).config.agent_store);  // c10d's localhost:0, as torchrun runs it
  CHECK_FALSE(parsed({"--standalone", "x"}).config.agent_store);
  for (const char* nnodes : {"--nnodes=1", "--nnodes=1:1"}) {
    const ParsedCommandLine one = parsed({"--rdzv_backend=c10d", nnodes, "--rdzv_endpoint=127.0.0.1:29400", "x"});
    CHECK_FALSE(one.config.agent_store);
    CHECK_FALSE(rendezvous_settings(one.config).agent_store);
    CHECK(one.notes.empty());
  }
  CHECK(parsed({"--master_port=29500", "x"}).config.agent_store);  // static ignores it, as torchrun's
  CHECK(parsed({"--nnodes=2", "--master_addr=10.0.0.1", "x"}).config.agent_store);
  const ParsedCommandLine several = parsed({"--rdzv_backend=c10d", "--nnodes=1:2", "--rdzv_endpoint=node01:29400", "x"});
  CHECK(several.config.agent_store);
  REQUIRE(several.notes.size() == 1);
  CHECK_THAT(several.notes[0], Contains("one node only") && Contains("--nnodes=1:2") && Contains("authenticated link"));
}

TEST_CASE("launch_config: --virtual_local_rank needs a visible GPU per worker", "[launch_config]") {
  CHECK(parse({"--virtual_local_rank", "--nproc_per_node=2", "x"}).virtual_local_rank);
  const auto one_gpu = [](const std::string& name) -> std::optional<std::string> {
    if (name == "CUDA_VISIBLE_DEVICES") return std::string("3");
    return std::nullopt;
  };
  CHECK_THAT(usage_error_text([&] {
               parse_launch_config({"--virtual-local-rank", "--nproc_per_node=2", "x"}, fake_host(), one_gpu);
             }),
             Contains("CUDA_VISIBLE_DEVICES=3") && Contains("--nproc_per_node=2"));
}

TEST_CASE("launch_config: --print_completion prints a script for cpprun's options", "[launch_config]") {
  const std::string bash = cli_help({"--print_completion", "bash"});
  CHECK_THAT(bash, Contains("complete -o default -W") && Contains("--nproc_per_node") && Contains("cpprun"));
  CHECK_THAT(cli_help({"--print-completion=zsh"}), Contains("bashcompinit"));
  CHECK_THAT(usage_error({"--print_completion=fish"}), Contains("bash, zsh, tcsh"));
}
