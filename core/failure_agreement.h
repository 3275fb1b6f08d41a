// For collective steps that only some ranks can fail (rank 0 writes or reads a file, each rank
// reads its part): every rank learns whether any failed, so none waits for a failed rank in the
// next collective until the timeout.
#pragma once

#include <exception>
#include <string>

#include "cpprun/process_group.h"

namespace cpprun::detail {

// Collective; also a barrier. `local` is this rank's error, or null. Rethrows it; on the ranks
// without one, throws an error naming `what` and the ranks that failed; else returns.
void agree_on_failure(const ProcessGroup& group, std::exception_ptr local, const std::string& what);

}  // namespace cpprun::detail
