// For collective steps that only some ranks can fail (rank 0 writes or reads a file, each rank
// reads its part): every rank learns whether any failed, so none waits for a failed rank in the
// next collective until the timeout.
#pragma once

#include <c10/util/Exception.h>

#include <exception>
#include <string>

#include "cpprun/process_group.h"

namespace cpprun::detail {

// What a rank whose own step went well throws when the agreement says another rank's failed: a
// c10::Error (as every cpprun check), of its own type so that a caller can tell it from the
// rank's own error (an asynchronous save raises only the rank's own; checkpoint/async_save.cpp).
class FailedElsewhereError : public c10::Error {
 public:
  using c10::Error::Error;
};
// Throws a FailedElsewhereError saying MESSAGE.
[[noreturn]] void throw_failed_elsewhere(const std::string& message);

// Collective; also a barrier. `local` is this rank's error, or null. Rethrows it; on the ranks
// without one, throws a FailedElsewhereError naming `what` and the ranks that failed; else returns.
void agree_on_failure(const ProcessGroup& group, std::exception_ptr local, const std::string& what);

// As agree_on_failure, but every rank throws the failing rank's own error (the lowest such rank's),
// not only that it failed: a checkpoint's error of its kind (StateDictMismatchError, ...), else a
// FailedElsewhereError of its message, naming that rank and `what`. Collective: an all-reduce, and
// when some rank failed, an all-gather of the messages.
void share_failure(const ProcessGroup& group, std::exception_ptr local, const std::string& what);
// The throw of share_failure: `described` (describe_failure's bytes) raised on `rank` of a group.
[[noreturn]] void throw_failure_of(const std::string& described, int rank, const std::string& what);

// For a step only rank 0 can fail (it reads a file whose contents the others then receive): every
// rank throws rank 0's error, of its kind and with its message, so that a user catching on any
// rank learns what was wrong (a missing key, a damaged file), not only that rank 0 failed.
// Collective (one broadcast from rank 0); `root_failure` is rank 0's error (null: none; ignored
// on the other ranks). Rank 0 rethrows its own.
void share_root_failure(const ProcessGroup& group, std::exception_ptr root_failure);

// The same in two halves, for a broadcast that carries a result when nothing failed: a failure
// as bytes (its kind, a letter, then its message; never empty), and, on a rank that received
// them, that failure thrown again: StateDictMismatchError, CorruptCheckpointError, else
// std::runtime_error, the message followed by " (raised on rank R)", R = `rank` (the rank that
// failed: the root, or a reader of a directory, checkpoint/parallel_load.h), unless the message
// ends with such a rank already (a failure relayed again keeps the rank that raised it).
std::string describe_failure(const std::exception_ptr& failure);
[[noreturn]] void throw_described_failure(const std::string& described, int rank = 0);

}  // namespace cpprun::detail
