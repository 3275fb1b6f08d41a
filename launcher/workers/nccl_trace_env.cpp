// The dump prefix for PyTorch's NCCL flight recorder, unless the user chose one.
#include "workers/nccl_trace_env.h"

namespace cpprun::launcher {

std::map<std::string, std::string> nccl_trace_variables(const std::map<std::string, std::string>& parent,
                                                        const std::string& dir) {
  for (const char* name : kNcclTraceFileVariables) {
    // Set at all, even to "": the user's choice, and then the launcher does not know where to look.
    if (parent.count(name) != 0) return {};
  }
  std::map<std::string, std::string> set;
  for (const char* name : kNcclTraceFileVariables) set[name] = dir + "/" + kNcclTraceFilePrefix;
  return set;
}

}  // namespace cpprun::launcher
