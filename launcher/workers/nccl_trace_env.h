// Where PyTorch's own NCCL flight recorder (c10d's ProcessGroupNCCL) dumps its trace. On a watchdog
// timeout or error each rank pickles it to <prefix><rank>, the prefix from TORCH_FR_DUMP_TEMP_FILE or
// its older name TORCH_NCCL_DEBUG_INFO_TEMP_FILE (default /tmp/nccl_trace_rank_): shared by every job
// on the host, so one job's dump overwrites another's, and unknown to the launcher. cpprun
// points both names at the attempt's own directory instead, so the diagnosis can name the dumps
// (diagnosis/nccl_trace.h). Pure, so the rule is unit-tested.
#pragma once

#include <map>
#include <string>

#include "diagnosis/nccl_trace.h"  // kNcclTraceFileVariables, kNcclTraceFilePrefix

namespace cpprun::launcher {

// The variables to add to a worker's environment: both prefix names set to DIR/rank_; nothing when the
// user's environment (`parent`) sets either name (the user chose where dumps go: all are left alone).
// Nothing else: the trace (TORCH_FR_BUFFER_SIZE, default 2000 entries) and its dump on a timeout
// (TORCH_FR_DUMP_ON_TIMEOUT, default on) are on by default in LibTorch; a user's "off" is respected.
std::map<std::string, std::string> nccl_trace_variables(const std::map<std::string, std::string>& parent,
                                                        const std::string& dir);

}  // namespace cpprun::launcher
