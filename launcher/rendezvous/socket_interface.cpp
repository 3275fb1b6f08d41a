// The workers' socket interface in a multi-node job: see socket_interface.h.
#include "rendezvous/socket_interface.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <set>

namespace cpprun::launcher {

namespace {

constexpr const char* kGloo = "GLOO_SOCKET_IFNAME";
constexpr const char* kNccl = "NCCL_SOCKET_IFNAME";

bool is_loopback(const std::string& address) { return address.rfind("127.", 0) == 0 || address == "::1"; }

bool user_set(const EnvMap& parent, const char* name) {
  const auto it = parent.find(name);
  return it != parent.end() && !it->second.empty();
}

std::string joined(const std::vector<std::string>& names) {
  std::string text;
  for (const std::string& name : names) text += (text.empty() ? "" : ", ") + name;
  return text;
}

}  // namespace

std::vector<InterfaceAddress> interface_addresses() {
  std::vector<InterfaceAddress> found;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return found;
  for (const ifaddrs* entry = list; entry; entry = entry->ifa_next) {
    if (!entry->ifa_addr || !entry->ifa_name) continue;
    char text[INET6_ADDRSTRLEN] = "";
    const int family = entry->ifa_addr->sa_family;
    if (family == AF_INET) {
      inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(entry->ifa_addr)->sin_addr, text, sizeof(text));
    } else if (family == AF_INET6) {
      inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(entry->ifa_addr)->sin6_addr, text, sizeof(text));
    } else {
      continue;
    }
    found.push_back({entry->ifa_name, text});
  }
  freeifaddrs(list);
  return found;
}

InterfaceChoice choose_socket_interface(const std::vector<std::string>& link_addresses,
                                        const std::vector<InterfaceAddress>& interfaces, const EnvMap& parent) {
  InterfaceChoice choice;
  const bool set_gloo = !user_set(parent, kGloo);
  const bool set_nccl = !user_set(parent, kNccl);
  if (!set_gloo && !set_nccl) {
    choice.kind = InterfaceChoiceKind::kUserSet;
    return choice;
  }
  // A member on the host's own machine meets it on the loopback; only the other links say which
  // interface the nodes share.
  // A closed link has no address ("").
  std::set<std::string> addresses;
  bool loopback = false;
  for (const std::string& address : link_addresses) {
    if (is_loopback(address)) {
      loopback = true;
    } else if (!address.empty()) {
      addresses.insert(address);
    }
  }
  if (addresses.empty()) {
    choice.kind = loopback ? InterfaceChoiceKind::kLoopback : InterfaceChoiceKind::kNoLink;
    return choice;
  }
  std::set<std::string> holders;  // the interfaces holding any of the addresses
  for (const std::string& address : addresses) {
    bool held = false;
    for (const InterfaceAddress& entry : interfaces) {
      if (entry.address != address) continue;
      holders.insert(entry.interface);
      held = true;
    }
    if (!held) {
      choice.kind = InterfaceChoiceKind::kNotLocal;
      choice.address = address;
      return choice;
    }
  }
  if (holders.size() > 1) {
    choice.kind = InterfaceChoiceKind::kAmbiguous;
    choice.candidates.assign(holders.begin(), holders.end());
    return choice;
  }
  choice.kind = InterfaceChoiceKind::kChosen;
  choice.interface = *holders.begin();
  choice.address = joined({addresses.begin(), addresses.end()});
  if (set_gloo) choice.variables[kGloo] = choice.interface;
  if (set_nccl) choice.variables[kNccl] = "=" + choice.interface;
  return choice;
}

std::string describe_interface_choice(const InterfaceChoice& choice, int node_rank, LinkSide side) {
  const std::string node = "cpprun: node " + std::to_string(node_rank) + ": ";
  const std::string whose = side == LinkSide::kHost ? "the address the other nodes' agents reached this one at"
                                                    : "the address this node reaches the rendezvous host from";
  switch (choice.kind) {
    case InterfaceChoiceKind::kChosen: {
      const bool gloo = choice.variables.count(kGloo) > 0;
      const bool nccl = choice.variables.count(kNccl) > 0;
      const std::string who = gloo && nccl ? "Gloo and NCCL use" : gloo ? "Gloo uses" : "NCCL uses";
      const std::string which = gloo && nccl ? std::string(kGloo) + " (and NCCL_SOCKET_IFNAME)" : gloo ? kGloo : kNccl;
      return node + "workers' " + who + " interface " + choice.interface + " (" + choice.address + ", " + whose +
             "); set " + which + " to choose another";
    }
    case InterfaceChoiceKind::kNotLocal:
      return node + "no interface of this host holds " + choice.address + ", " + whose +
             " (a NAT between the nodes?); the workers' "
             "Gloo and NCCL choose their own. If they cannot connect, set GLOO_SOCKET_IFNAME and "
             "NCCL_SOCKET_IFNAME to the interface the other nodes reach";
    case InterfaceChoiceKind::kAmbiguous:
      return node + "the other nodes reach this one at addresses on several interfaces (" +
             joined(choice.candidates) +
             "); the workers' Gloo and NCCL choose their own. If they cannot connect, set GLOO_SOCKET_IFNAME "
             "and NCCL_SOCKET_IFNAME to the interface every node reaches";
    case InterfaceChoiceKind::kUserSet:
    case InterfaceChoiceKind::kNoLink:
    case InterfaceChoiceKind::kLoopback:
      return "";
  }
  return "";
}

}  // namespace cpprun::launcher
