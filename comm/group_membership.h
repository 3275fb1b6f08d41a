// Refusing a group this process is not a member of: what every public entry taking a group
// (collectives, the wrappers, the sampler, SyncBatchNorm, ...) checks first.
#pragma once

#include "cpprun/process_group.h"

namespace cpprun::detail {

// Throws when this process is not a member of `group` (a subgroup created without it), naming
// `op` (printed as cpprun::op), this process's rank in the group it was created from, and the
// group's ranks. As PyTorch, where a non-member holds GroupMember.NON_GROUP_MEMBER, whose
// get_world_size is -1 and which DistributedDataParallel refuses: used, it would run alone.
void check_member(const char* op, const ProcessGroup& group);

// check_member, then the group itself: for a constructor's member initializers.
inline ProcessGroup member_group(const char* op, ProcessGroup group) {
  check_member(op, group);
  return group;
}

}  // namespace cpprun::detail
