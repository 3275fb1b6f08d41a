// The host name the nodes (or one node's workers) meet at must resolve, checked before anything
// starts: else a misspelt --master_addr shows only after the join timeout, as "nothing answered".
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "rendezvous/rendezvous_settings.h"

namespace cpprun::launcher {

// What getaddrinfo() said about a host name.
struct HostLookup {
  enum class Result {
    kResolved,
    kUnknown,    // the name does not exist (EAI_NONAME, EAI_NODATA, EAI_FAIL): retrying cannot help
    kTemporary,  // the resolver could not answer now (EAI_AGAIN: DNS unreachable, say)
  };
  Result result = Result::kResolved;
  std::string error;  // gai_strerror's text, e.g. "Name or service not known"
};

HostLookup look_up_host(const std::string& host);

// Throws UsageError (exit code 2), naming the flag and the host, if settings.host (--master_addr,
// or c10d's --rdzv_endpoint host) does not exist; RendezvousError (exit code 1) if the resolver
// gave no answer for about 5 s. `look_up` is for tests.
void check_meeting_host_resolves(const RendezvousSettings& settings,
                                 const std::function<HostLookup(const std::string&)>& look_up = look_up_host);

}  // namespace cpprun::launcher
