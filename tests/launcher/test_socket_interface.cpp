// Unit tests of which interface a multi-node job's workers' Gloo and NCCL are told to use: the one
// holding the address this node meets the rendezvous host at, unless the user chose, and nothing on
// one host or one node.
#include "catch.h"

#include <string>
#include <vector>

#include "rendezvous/socket_interface.h"

using namespace cpprun::launcher;

namespace {

// A host whose name resolves to 127.0.0.1, with two networks: eth0 and eth1 (and eth10, which a
// bare NCCL_SOCKET_IFNAME=eth1 would match too).
const std::vector<InterfaceAddress> kInterfaces = {
    {"lo", "127.0.0.1"},        {"eth0", "10.0.0.2"},        {"eth1", "192.168.1.2"}, {"eth10", "172.16.0.2"},
    {"lo", "::1"},              {"eth0", "fd00::2"},         {"eth0", "fe80::2"},
};

}  // namespace

TEST_CASE("socket_interface: a member's link names the interface; NCCL gets the exact form", "[socket_interface]") {
  const InterfaceChoice choice = choose_socket_interface({"192.168.1.2"}, kInterfaces, {{"PATH", "/bin"}});
  CHECK(choice.kind == InterfaceChoiceKind::kChosen);
  CHECK(choice.interface == "eth1");
  CHECK(choice.variables == EnvMap{{"GLOO_SOCKET_IFNAME", "eth1"}, {"NCCL_SOCKET_IFNAME", "=eth1"}});
  CHECK(describe_interface_choice(choice, 1, LinkSide::kMember) ==
        "cpprun: node 1: workers' Gloo and NCCL use interface eth1 (192.168.1.2, the address this node reaches the "
        "rendezvous host from); set GLOO_SOCKET_IFNAME (and NCCL_SOCKET_IFNAME) to choose another");
}

TEST_CASE("socket_interface: IPv6 works the same", "[socket_interface]") {
  const InterfaceChoice choice = choose_socket_interface({"fd00::2"}, kInterfaces, {});
  CHECK(choice.kind == InterfaceChoiceKind::kChosen);
  CHECK(choice.variables == EnvMap{{"GLOO_SOCKET_IFNAME", "eth0"}, {"NCCL_SOCKET_IFNAME", "=eth0"}});
}

TEST_CASE("socket_interface: the host, reached at one interface by every member", "[socket_interface]") {
  // Two members came to 10.0.0.2, one from this host over the loopback, and a lost one's link is
  // closed ("").
  const InterfaceChoice choice = choose_socket_interface({"10.0.0.2", "127.0.0.1", "10.0.0.2", ""}, kInterfaces, {});
  CHECK(choice.kind == InterfaceChoiceKind::kChosen);
  CHECK(choice.interface == "eth0");
  CHECK(describe_interface_choice(choice, 0, LinkSide::kHost) ==
        "cpprun: node 0: workers' Gloo and NCCL use interface eth0 (10.0.0.2, the address the other nodes' agents "
        "reached this one at); set GLOO_SOCKET_IFNAME (and NCCL_SOCKET_IFNAME) to choose another");
}

TEST_CASE("socket_interface: the user's variable is left alone, each on its own", "[socket_interface]") {
  const InterfaceChoice both = choose_socket_interface({"10.0.0.2"}, kInterfaces,
                                                      {{"GLOO_SOCKET_IFNAME", "eth1"}, {"NCCL_SOCKET_IFNAME", "ib"}});
  CHECK(both.kind == InterfaceChoiceKind::kUserSet);
  CHECK(both.variables.empty());
  CHECK(describe_interface_choice(both, 1, LinkSide::kMember).empty());

  const InterfaceChoice gloo_set = choose_socket_interface({"10.0.0.2"}, kInterfaces, {{"GLOO_SOCKET_IFNAME", "eth1"}});
  CHECK(gloo_set.variables == EnvMap{{"NCCL_SOCKET_IFNAME", "=eth0"}});
  CHECK(describe_interface_choice(gloo_set, 1, LinkSide::kMember) ==
        "cpprun: node 1: workers' NCCL uses interface eth0 (10.0.0.2, the address this node reaches the rendezvous "
        "host from); set NCCL_SOCKET_IFNAME to choose another");

  const InterfaceChoice nccl_set =
      choose_socket_interface({"10.0.0.2"}, kInterfaces, {{"NCCL_SOCKET_IFNAME", "^docker"}});
  CHECK(nccl_set.variables == EnvMap{{"GLOO_SOCKET_IFNAME", "eth0"}});
  CHECK(describe_interface_choice(nccl_set, 1, LinkSide::kMember).find("workers' Gloo uses interface eth0") !=
        std::string::npos);
}

TEST_CASE("socket_interface: set empty is unset, as PyTorch, NCCL and the library read it", "[socket_interface]") {
  const InterfaceChoice choice =
      choose_socket_interface({"10.0.0.2"}, kInterfaces, {{"GLOO_SOCKET_IFNAME", ""}, {"NCCL_SOCKET_IFNAME", ""}});
  CHECK(choice.variables == EnvMap{{"GLOO_SOCKET_IFNAME", "eth0"}, {"NCCL_SOCKET_IFNAME", "=eth0"}});
}

TEST_CASE("socket_interface: one host, or no other node, changes nothing", "[socket_interface]") {
  for (const std::vector<std::string>& links :
       {std::vector<std::string>{"127.0.0.1"}, {"127.0.0.5", "127.0.0.1"}, {"::1"}}) {
    const InterfaceChoice choice = choose_socket_interface(links, kInterfaces, {});
    CHECK(choice.kind == InterfaceChoiceKind::kLoopback);
    CHECK(choice.variables.empty());
    CHECK(describe_interface_choice(choice, 1, LinkSide::kMember).empty());
  }
  for (const std::vector<std::string>& links : {std::vector<std::string>{}, {""}}) {
    const InterfaceChoice choice = choose_socket_interface(links, kInterfaces, {});
    CHECK(choice.kind == InterfaceChoiceKind::kNoLink);
    CHECK(choice.variables.empty());
    CHECK(describe_interface_choice(choice, 0, LinkSide::kHost).empty());
  }
}

TEST_CASE("socket_interface: links on several interfaces choose none, and say so", "[socket_interface]") {
  const InterfaceChoice choice = choose_socket_interface({"10.0.0.2", "192.168.1.2"}, kInterfaces, {});
  CHECK(choice.kind == InterfaceChoiceKind::kAmbiguous);
  CHECK(choice.candidates == std::vector<std::string>{"eth0", "eth1"});
  CHECK(choice.variables.empty());
  CHECK(describe_interface_choice(choice, 0, LinkSide::kHost) ==
        "cpprun: node 0: the other nodes reach this one at addresses on several interfaces (eth0, eth1); the "
        "workers' Gloo and NCCL choose their own. If they cannot connect, set GLOO_SOCKET_IFNAME and "
        "NCCL_SOCKET_IFNAME to the interface every node reaches");
  // One address held by two interfaces is as ambiguous.
  const InterfaceChoice twice = choose_socket_interface({"10.9.9.9"}, {{"br0", "10.9.9.9"}, {"eth0", "10.9.9.9"}}, {});
  CHECK(twice.kind == InterfaceChoiceKind::kAmbiguous);
}

TEST_CASE("socket_interface: an address no interface holds chooses none, and says so", "[socket_interface]") {
  const InterfaceChoice choice = choose_socket_interface({"203.0.113.7"}, kInterfaces, {});
  CHECK(choice.kind == InterfaceChoiceKind::kNotLocal);
  CHECK(choice.variables.empty());
  CHECK(describe_interface_choice(choice, 1, LinkSide::kMember).find("no interface of this host holds 203.0.113.7") !=
        std::string::npos);
}

TEST_CASE("socket_interface: this machine's interfaces include the loopback", "[socket_interface]") {
  const std::vector<InterfaceAddress> found = interface_addresses();
  bool loopback = false;
  for (const InterfaceAddress& entry : found) loopback = loopback || entry.address == "127.0.0.1";
  CHECK(loopback);
}
