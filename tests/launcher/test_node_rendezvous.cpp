// Unit tests of opening the rendezvous: the start-up check that --master_addr (or c10d's endpoint
// host) resolves; the pause between tries to reach the host; the errors a job's end becomes.
#include "catch.h"

#include <string>

#include "rendezvous/node_rendezvous.h"
#include "usage_error_text.h"

using namespace cpprun::launcher;
using Catch::Matchers::Contains;

namespace {

RendezvousSettings config_for(const std::string& host, RendezvousBackend backend = RendezvousBackend::kStatic,
                              int nnodes = 2) {
  RendezvousSettings config;
  config.host = host;
  config.backend = backend;
  config.min_nodes = config.max_nodes = nnodes;
  return config;
}

HostLookup answer(HostLookup::Result result, const std::string& error = "") {
  HostLookup lookup;
  lookup.result = result;
  lookup.error = error;
  return lookup;
}

std::string usage_error(const RendezvousSettings& config, const HostLookup& lookup) {
  return usage_error_text([&] { check_meeting_host_resolves(config, [&](const std::string&) { return lookup; }); });
}

}  // namespace

TEST_CASE("node_rendezvous: a meeting host that does not exist fails at once, naming the flag and the host",
          "[node_rendezvous]") {
  const HostLookup unknown = answer(HostLookup::Result::kUnknown, "Name or service not known");
  CHECK_THAT(usage_error(config_for("nosuch.invalid"), unknown),
             Contains("cannot resolve --master_addr=nosuch.invalid: Name or service not known") &&
                 Contains("node 0's host name"));
  CHECK_THAT(usage_error(config_for("nosuch.invalid", RendezvousBackend::kStatic, 1), unknown),
             Contains("cannot resolve --master_addr=nosuch.invalid") && Contains("the job's only host"));
  RendezvousSettings c10d = config_for("nosuch.invalid", RendezvousBackend::kC10d);
  c10d.port = 29400;
  CHECK_THAT(usage_error(c10d, unknown), Contains("cannot resolve the host of --rdzv_endpoint=nosuch.invalid:29400"));
}

TEST_CASE("node_rendezvous: a resolvable meeting host passes, asked once", "[node_rendezvous]") {
  int asked = 0;
  std::string host;
  check_meeting_host_resolves(config_for("node01"), [&](const std::string& h) {
    ++asked;
    host = h;
    return answer(HostLookup::Result::kResolved);
  });
  CHECK(asked == 1);
  CHECK(host == "node01");
}

TEST_CASE("node_rendezvous: a resolver that cannot answer now is asked again", "[node_rendezvous]") {
  int asked = 0;
  check_meeting_host_resolves(config_for("node01"), [&](const std::string&) {
    return ++asked < 3 ? answer(HostLookup::Result::kTemporary, "Temporary failure in name resolution")
                       : answer(HostLookup::Result::kResolved);
  });
  CHECK(asked == 3);
}

TEST_CASE("node_rendezvous: the real resolver: numeric addresses and localhost resolve, .invalid does not",
          "[node_rendezvous]") {
  CHECK(look_up_host("127.0.0.1").result == HostLookup::Result::kResolved);
  CHECK(look_up_host("::1").result == HostLookup::Result::kResolved);
  CHECK(look_up_host("localhost").result == HostLookup::Result::kResolved);
  // RFC 6761: never resolves. Without DNS (a private network namespace) the answer is "try again".
  const HostLookup lookup = look_up_host("nosuch.invalid");
  CHECK(lookup.result != HostLookup::Result::kResolved);
  CHECK_FALSE(lookup.error.empty());
}

TEST_CASE("node_rendezvous: tries to reach the host pause 5 ms, doubling to 100 ms", "[node_rendezvous]") {
  // Both after a refused connect and after a link closed before the handshake (Note [Pending links
  // under a flood]): never a tight loop, at most ten connections a second once waiting long.
  using std::chrono::milliseconds;
  CHECK(retry_pause(0) == milliseconds(5));
  CHECK(retry_pause(1) == milliseconds(10));
  CHECK(retry_pause(4) == milliseconds(80));
  CHECK(retry_pause(5) == milliseconds(100));
  CHECK(retry_pause(1000000) == milliseconds(100));
  CHECK(retry_pause(-1) == milliseconds(5));
}

TEST_CASE("node_rendezvous: a job's end becomes an error that starts with cpprun:, once", "[node_rendezvous]") {
  // A reason this agent found itself (its link to node 0 refused its proof) has no prefix...
  const RendezvousError refused = job_end_error(
      {1, false, "the agent of node 0 (10.0.0.1:29500) refused this agent's proof of the job secret"});
  CHECK(std::string(refused.what()) ==
        "cpprun: the agent of node 0 (10.0.0.1:29500) refused this agent's proof of the job secret");
  CHECK(refused.exit_code() == 1);
  // ...one the host wrote for the console has it already, and keeps one.
  const RendezvousError told = job_end_error({2, false, "cpprun: the agent hosting the rendezvous refused this agent"});
  CHECK(std::string(told.what()) == "cpprun: the agent hosting the rendezvous refused this agent");
  CHECK(told.exit_code() == 2);
}
