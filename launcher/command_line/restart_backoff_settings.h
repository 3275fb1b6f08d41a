// What --restart_backoff=INITIAL[:MAX] asked for. Apart from the backoff itself
// (workers/restart_backoff.h) because the command line fills it in and may not include workers/.
#pragma once

#include <chrono>

namespace cpprun::launcher {

struct RestartBackoffSettings {
  // Before the first restart of a run of failures. 0: every restart at once (torchrun's behaviour).
  std::chrono::milliseconds initial{1000};
  // The cap. An attempt that ran at least this long was healthy: the next delay is `initial` again.
  std::chrono::milliseconds max{30000};
};

}  // namespace cpprun::launcher
