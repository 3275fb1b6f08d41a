// The cross-rank check made before a collective runs (every collective under
// TORCH_DISTRIBUTED_DEBUG=DETAIL; by default Gloo's all_reduce, broadcast, gather, scatter and
// reduce): the ranks all-gather their calls' fingerprints over the group's Gloo backend, and
// every rank throws the same error, naming each rank's call, if they differ.
// See Note [Collective consistency check].
#pragma once

#include <cstdint>

#include "comm/collective_fingerprint.h"
#include "comm/group_impl.h"
#include "cpprun/env_lookup.h"

namespace cpprun::detail {

// Blocks until every rank of `group` has reached its collective number `sequence`; throws
// c10::Error naming the ranks' calls when they are not all `call`, or naming the call when not
// every rank reached it within the group's timeout.
void check_across_ranks(GroupImpl& group, const CollectiveCall& call, uint64_t sequence);

// CPPRUN_CHECK_COLLECTIVES: "1" or unset, the default mode checks Gloo's all_reduce, broadcast,
// gather, scatter and reduce across ranks before they run; "0" turns those checks off (DETAIL
// still checks every collective). Anything else throws, naming the value.
bool read_check_collectives(const EnvLookup& lookup);

}  // namespace cpprun::detail
