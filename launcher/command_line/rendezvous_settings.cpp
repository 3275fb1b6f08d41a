// See rendezvous_settings.h.
#include "command_line/rendezvous_settings.h"

namespace cpprun::launcher {

const char* backend_name(RendezvousBackend backend) {
  return backend == RendezvousBackend::kC10d ? "c10d" : "static";
}

std::string RendezvousSettings::endpoint() const { return endpoint_text(host, port); }

std::string RendezvousSettings::nnodes_flag() const {
  if (fixed_ranks()) return "--nnodes=" + std::to_string(max_nodes);
  return "--nnodes=" + std::to_string(min_nodes) + ":" + std::to_string(max_nodes);
}

std::string endpoint_text(const std::string& host, int port) {
  const bool ipv6 = host.find(':') != std::string::npos;
  return (ipv6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

}  // namespace cpprun::launcher
