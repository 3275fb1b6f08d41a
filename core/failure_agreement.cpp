// See failure_agreement.h.
#include "core/failure_agreement.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "cpprun/collectives.h"

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
  TORCH_CHECK(ranks.empty(), "cpprun: ", what, " failed on rank ", ranks, " (its own error says why); rank ",
              group.rank(), " stops too.");
}

}  // namespace cpprun::detail
