// Whether a failed wait on peers means a peer's process is gone. Gloo says so at once ("Connection
// closed by peer") when a rank exits or dies, long before any timeout; a message saying "within
// 1800000 ms" would then send the reader looking for a hang that never was.
#pragma once

#include <string>

namespace cpprun::detail {

inline bool peer_connection_lost(const std::string& c10d_error) {
  for (const char* sign : {"Connection closed by peer", "Connection reset by peer", "Broken pipe"}) {
    if (c10d_error.find(sign) != std::string::npos) return true;
  }
  return false;
}

}  // namespace cpprun::detail
