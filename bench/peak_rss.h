// The memory benchmarks' measure: this process's peak resident memory (VmHWM), and resetting
// it to the current size (Linux 4.0+: writing 5 to /proc/self/clear_refs).
#pragma once

#include <cstdint>
#include <fstream>
#include <string>

namespace bench {

inline int64_t peak_rss() {
  std::ifstream status("/proc/self/status");
  std::string key;
  int64_t kb = 0;
  while (status >> key) {
    if (key == "VmHWM:") {
      status >> kb;
      break;
    }
  }
  return kb * 1024;
}

inline void reset_peak_rss() { std::ofstream("/proc/self/clear_refs") << "5"; }

}  // namespace bench
