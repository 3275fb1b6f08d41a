// The check before a collective (every one under DETAIL; Gloo all_reduce, broadcast, gather, scatter
// and reduce by default): an all-gather of fingerprints, compared on every rank.
#include "comm/consistency_check.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <numeric>
#include <sstream>

#include "comm/collective_wait.h"
#include "comm/peer_loss.h"

namespace cpprun::detail {

// Note [Collective consistency check]
// Mismatched collectives do not fail cleanly on their own: Gloo fills a broadcast's larger
// buffer half and returns, or aborts in its I/O thread where no try/catch reaches; NCCL hangs.
// So, before the collective is issued, the ranks all-gather a fixed-size fingerprint of their
// calls (comm/collective_fingerprint.h) over the same group's Gloo backend and compare. Every
// rank receives every fingerprint, so every rank sees a mismatch and throws the same message.
// Order: a fingerprint exchange pairs with the other ranks' exchange by Gloo's per-group
// collective order, so the exchange and the collective it guards must be issued with nothing
// in between: callers hold GroupImpl::issue_mutex across both (DDP issues bucket
// all-reduces from autograd hooks, possibly beside other threads' collectives). Async
// collectives become synchronous up to the exchange, as under PyTorch's ProcessGroupWrapper.
void check_across_ranks(GroupImpl& group, const CollectiveCall& call, uint64_t sequence) {
  const int world = group.env.world_size;
  at::Tensor mine = fingerprint(call, sequence);
  std::vector<at::Tensor> inputs{mine};
  std::vector<std::vector<at::Tensor>> outputs(1);
  for (int r = 0; r < world; ++r) outputs[0].push_back(at::empty_like(mine));
  try {
    CollectiveWaitScope waiting;  // a slow rank is waited for here, before the collective itself
    group.gloo->allgather(outputs, inputs)->wait(group.timeout);
  } catch (const std::exception& e) {
    const std::string said = c10d_text(e);
    if (closed_by_earlier_timeout(said)) {
      TORCH_CHECK(false, "cpprun: collective #", sequence, " ", describe(mine), " on rank ", group.env.rank, ": ",
                  c10d_meaning(said), ".\nc10d said: ", said);
    }
    if (peer_connection_lost(said)) {
      TORCH_CHECK(false, "cpprun: collective #", sequence, " ", describe(mine), " on rank ", group.env.rank,
                  ": a rank's process ended before reaching it (its connection closed). It exited or "
                  "failed: its own output and cpprun's diagnosis say which. A rank that returns while "
                  "the others still call collectives made fewer collectives than they did.\nc10d said: ",
                  said);
    }
    TORCH_CHECK(false, "cpprun: collective #", sequence, " ", describe(mine), " on rank ",
                group.env.rank, ": not every rank reached it within ", group.timeout.count(),
                " ms (the check before each collective waits for all ranks). A rank may have "
                "stopped, failed, or be waiting in a different number of collectives; its own "
                "output says which.\nc10d said: ", said);
  }
  std::vector<int> ranks(world);
  std::iota(ranks.begin(), ranks.end(), 0);
  if (auto message = mismatch(mine, outputs[0], ranks, Agreement::kExact)) {
    TORCH_CHECK(false, *message, " (found on rank ", group.env.rank,
                " by the check before each collective.)");
  }
}

bool read_check_collectives(const EnvLookup& lookup) {
  const auto value = lookup("CPPRUN_CHECK_COLLECTIVES");
  if (!value || *value == "1") return true;
  if (*value == "0") return false;
  TORCH_CHECK(false, "cpprun: CPPRUN_CHECK_COLLECTIVES=\"", *value, "\" must be 1 (the default: Gloo's "
              "all_reduce, broadcast, gather, scatter and reduce compare every rank's call before they run) "
              "or 0 (no such check: a mismatch may give a wrong result or abort in Gloo).");
}

}  // namespace cpprun::detail
