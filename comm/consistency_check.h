// The cross-rank check made before a collective runs (every collective under
// TORCH_DISTRIBUTED_DEBUG=DETAIL; Gloo broadcasts always): the ranks all-gather their calls'
// fingerprints over the group's Gloo backend, and every rank throws the same error, naming each
// rank's call, if they differ. See Note [Collective consistency check].
#pragma once

#include <cstdint>

#include "comm/collective_fingerprint.h"
#include "comm/group_impl.h"

namespace cpprun::detail {

// Blocks until every rank of `group` has reached its collective number `sequence`; throws
// c10::Error naming the ranks' calls when they are not all `call`, or naming the call when not
// every rank reached it within the group's timeout.
void check_across_ranks(GroupImpl& group, const CollectiveCall& call, uint64_t sequence);

}  // namespace cpprun::detail
