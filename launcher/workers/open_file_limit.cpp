// See open_file_limit.h.
#include "workers/open_file_limit.h"

#include <sys/resource.h>

#include <cerrno>

namespace cpprun::launcher {
namespace {

// The caller's limits, kept when raise_open_file_limit raised them.
struct rlimit g_callers_limit {};
bool g_raised = false;

}  // namespace

void raise_open_file_limit() {
  struct rlimit limit {};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return;
  const rlim_t cap = rlim_t{1} << 20;  // close_on_exec_from's loop bound, where close_range is missing
  const rlim_t wanted = limit.rlim_max == RLIM_INFINITY || limit.rlim_max > cap ? cap : limit.rlim_max;
  if (limit.rlim_cur == RLIM_INFINITY || limit.rlim_cur >= wanted) return;
  struct rlimit raised = limit;
  raised.rlim_cur = wanted;
  if (setrlimit(RLIMIT_NOFILE, &raised) != 0) return;
  g_callers_limit = limit;
  g_raised = true;
}

void restore_open_file_limit_in_child() noexcept {
  if (g_raised) setrlimit(RLIMIT_NOFILE, &g_callers_limit);
}

std::string open_file_limit_hint(int error) {
  if (error != EMFILE) return "";
  struct rlimit limit {};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return "";
  const auto text = [](rlim_t value) {
    return value == RLIM_INFINITY ? std::string("unlimited") : std::to_string(value);
  };
  return " (this process's open-file limit is " + text(limit.rlim_cur) + ", hard limit " + text(limit.rlim_max) +
         ": cpprun holds about three descriptors a worker and six while starting them; start fewer workers a "
         "node, or raise the hard limit: nofile in /etc/security/limits.conf, LimitNOFILE= of a systemd unit, "
         "docker run --ulimit nofile=N)";
}

}  // namespace cpprun::launcher
