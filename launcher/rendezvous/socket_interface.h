// Which network interface the workers' Gloo and NCCL listen on in a multi-node job, unless the user
// said. Left alone, Gloo binds the address this host's name resolves to, and many hosts (Debian's
// /etc/hosts, containers, network namespaces) resolve their own name to 127.0.0.1: rank 0 then
// advertises the loopback and the other nodes' ranks cannot connect, the most common multi-node
// trap PyTorch users report. The agents already know a working address: the local end of the link
// between this node and the rendezvous host. Deciding is pure (choose_socket_interface), so the
// rules are unit-tested; reading the interfaces (getifaddrs) is apart.
#pragma once

#include <string>
#include <vector>

#include "rendezvous/node_link.h"  // LinkSide
#include "workers/worker_specs.h"   // EnvMap

namespace cpprun::launcher {

// One address of one interface, as getifaddrs() lists them; `address` numeric ("10.0.0.2", "fd00::2").
struct InterfaceAddress {
  std::string interface;
  std::string address;
};

// This machine's interface addresses (IPv4 and IPv6; none if getifaddrs fails).
std::vector<InterfaceAddress> interface_addresses();

enum class InterfaceChoiceKind {
  kChosen,       // `interface` holds the address: set in `variables` whichever the user did not set
  kUserSet,      // the user set both GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME: nothing to do
  kNoLink,       // this node has no link to another node's agent (one node in the round)
  kLoopback,     // the nodes meet on the loopback: one host, where Gloo's own choice works
  kNotLocal,     // no interface holds the address (a NAT in between?): nothing is set
  kAmbiguous,    // the links' addresses are on different interfaces, or one address on several
};

struct InterfaceChoice {
  InterfaceChoiceKind kind = InterfaceChoiceKind::kNoLink;
  std::string interface;  // kChosen
  std::string address;    // kChosen, kNotLocal: the address this node uses
  std::vector<std::string> candidates;  // kAmbiguous: the interfaces, sorted
  EnvMap variables;       // what to add to the workers' environment
};

// `link_addresses`: the local end of each of this agent's links to other nodes' agents (a member
// has one, to the host; the host one per member), numeric. `interfaces`: interface_addresses().
// `parent`: this process's environment; a variable set there is the user's and left alone (set
// empty, it is unset to PyTorch, NCCL and cpprun's library alike, so it counts as unset here too).
// GLOO_SOCKET_IFNAME gets the interface's name, NCCL_SOCKET_IFNAME "=name" (NCCL matches
// a bare name as a prefix: eth1 would match eth10 too).
InterfaceChoice choose_socket_interface(const std::vector<std::string>& link_addresses,
                                        const std::vector<InterfaceAddress>& interfaces, const EnvMap& parent);

// The line cpprun prints for `choice` on node `node_rank` ("cpprun: node 1: workers' Gloo and NCCL
// use interface veth1 (10.0.0.2, ...)"), or "" when there is nothing to say (the user set both, one
// node, the loopback). `side`: whether this agent hosts the rendezvous (node 0) or joined it.
std::string describe_interface_choice(const InterfaceChoice& choice, int node_rank, LinkSide side);

}  // namespace cpprun::launcher
