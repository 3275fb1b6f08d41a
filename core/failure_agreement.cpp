// See failure_agreement.h.
#include "core/failure_agreement.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <stdexcept>
#include <string_view>

#include "cpprun/checkpoint_file.h"
#include "cpprun/collectives.h"
#include "cpprun/object_collectives.h"
#include "cpprun/state_dict_options.h"

namespace cpprun::detail {

void agree_on_failure(const ProcessGroup& group, std::exception_ptr local, const std::string& what) {
  at::Tensor failed = at::zeros({group.size()}, at::kInt);
  if (local) failed[group.rank()] = 1;
  all_reduce(group, failed, ReduceOp::kSum);
  if (local) std::rethrow_exception(local);
  std::string ranks;
  for (int r = 0; r < group.size(); ++r) {
    if (failed[r].item<int>() != 0) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  }
  if (!ranks.empty()) {
    throw_failed_elsewhere("cpprun: " + what + " failed on rank " + ranks + " (its own error says why); rank " +
                           std::to_string(group.rank()) + " stops too.");
  }
}

void share_failure(const ProcessGroup& group, std::exception_ptr local, const std::string& what) {
  at::Tensor failed = at::zeros({1}, at::kInt);
  if (local) failed[0] = 1;
  all_reduce(group, failed, ReduceOp::kSum);
  if (failed.item<int>() == 0) return;
  const auto all = all_gather_bytes(group, local ? describe_failure(local) : std::string());
  if (local) std::rethrow_exception(local);
  for (std::size_t r = 0; r < all.size(); ++r) {
    if (!all[r].empty()) throw_failure_of(all[r], static_cast<int>(r), what);
  }
  TORCH_INTERNAL_ASSERT(false, "share_failure: a failure counted but not described");
}

namespace {

constexpr std::string_view kRaisedOn = " (raised on rank ";
constexpr std::string_view kSoEveryRank = ", so every rank refuses ";

// Whether `message` ends with " (raised on rank R)" or " (raised on rank R, so every rank refuses
// ...)": a failure relayed a second time (a pipeline's stage owners hear it from owner 0, then each
// owner's team from its owner; a pipeline group's refusal, then the data-parallel group's) names
// the rank that raised it once, not each rank that passed it on.
bool names_its_rank(const std::string& message) {
  const auto at = message.rfind(kRaisedOn);
  if (at == std::string::npos || message.back() != ')') return false;
  std::string_view rest = std::string_view(message).substr(at + kRaisedOn.size());
  const auto digits = rest.find_first_not_of("0123456789");
  if (digits == 0 || digits == std::string_view::npos) return false;
  rest.remove_prefix(digits);
  // " (raised on rank R)", or throw_failure_of's " (raised on rank R, so every rank refuses WHAT)".
  return rest == ")" || rest.rfind(kSoEveryRank, 0) == 0;
}

}  // namespace

void throw_failure_of(const std::string& described, int rank, const std::string& what) {
  // A checkpoint's own error keeps its kind; any other is a c10::Error, as the rank's own was.
  if (described[0] != 'E') throw_described_failure(described, rank);
  const std::string message = described.substr(1);
  if (names_its_rank(message)) throw_failed_elsewhere(message);
  throw_failed_elsewhere(message + std::string(kRaisedOn) + std::to_string(rank) + std::string(kSoEveryRank) + what +
                         ")");
}

void throw_failed_elsewhere(const std::string& message) {
  throw FailedElsewhereError(c10::SourceLocation{__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, message);
}

// The kinds a caller may catch by type; anything else travels as its message.
std::string describe_failure(const std::exception_ptr& failure) {
  try {
    std::rethrow_exception(failure);
  } catch (const StateDictMismatchError& e) {
    return std::string("M") + e.what();
  } catch (const CorruptCheckpointError& e) {
    return std::string("C") + e.what();
  } catch (const c10::Error& e) {
    return std::string("E") + e.what_without_backtrace();
  } catch (const std::exception& e) {
    return std::string("E") + e.what();
  } catch (...) {
    return "Ean error that is not a std::exception";
  }
}


void throw_described_failure(const std::string& described, int rank) {
  TORCH_INTERNAL_ASSERT(!described.empty(), "a described failure arrived empty");
  std::string message = described.substr(1);
  if (!names_its_rank(message)) message += std::string(kRaisedOn) + std::to_string(rank) + ")";
  if (described[0] == 'M') throw StateDictMismatchError(message);
  if (described[0] == 'C') throw CorruptCheckpointError(message);
  throw std::runtime_error(message);
}

void share_root_failure(const ProcessGroup& group, std::exception_ptr root_failure) {
  std::string bytes = group.rank() == 0 && root_failure ? describe_failure(root_failure) : std::string();
  broadcast_bytes(group, bytes, 0);
  if (group.rank() == 0 && root_failure) std::rethrow_exception(root_failure);
  if (!bytes.empty()) throw_described_failure(bytes);
}

}  // namespace cpprun::detail
