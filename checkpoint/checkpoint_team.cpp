// See checkpoint_team.h.
#include "checkpoint/checkpoint_team.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "core/failure_agreement.h"
#include "core/tensor_parallel_splits.h"
#include "cpprun/collectives.h"
#include "cpprun/object_collectives.h"

namespace cpprun::detail {

// Note [Teams over a {dp, tp} mesh]
// In a {dp, tp} mesh rank (d, t) belongs to the data-parallel group {(*, t)} and the
// tensor-parallel group {(d, *)}. A step over the data-parallel groups (each from its own rank 0,
// (0, t)) and then over the tensor-parallel groups (each from its rank 0, (d, 0)) brings (0, 0)'s
// value to every rank: after the first step (d, 0) holds (0, 0)'s. The same two steps of a max
// reach every rank's flag. The writers, (*, 0), are one whole data-parallel group, so a directory's
// shares are split among them exactly as without tensor parallelism.

CheckpointTeam::CheckpointTeam(std::optional<ProcessGroup> replicas, std::vector<ProcessGroup> tensor_parallel)
    : replicas_(std::move(replicas)), tensor_parallel_(std::move(tensor_parallel)) {
  for (const auto& group : tensor_parallel_) writes_ = writes_ && group.rank() == 0;
}

CheckpointTeam CheckpointTeam::also_over(const ProcessGroup& tensor_parallel) const {
  std::vector<const ProcessGroup*> groups;
  for (const auto& group : tensor_parallel_) groups.push_back(&group);
  groups.push_back(&tensor_parallel);
  return CheckpointTeam(replicas_, distinct_groups(groups));
}

int CheckpointTeam::writer_rank() const { return replicas_ ? replicas_->rank() : 0; }
int CheckpointTeam::writers() const { return replicas_ ? replicas_->size() : 1; }

void CheckpointTeam::agree(std::exception_ptr local, const std::string& what) const {
  if (alone()) {
    if (local) std::rethrow_exception(local);
    return;
  }
  if (tensor_parallel_.empty()) {
    agree_on_failure(*replicas_, local, what);  // names the failed ranks
    return;
  }
  at::Tensor failed = at::tensor({local ? 1 : 0}, at::kInt);
  if (replicas_) all_reduce(*replicas_, failed, ReduceOp::kMax);
  for (const auto& group : tensor_parallel_) all_reduce(group, failed, ReduceOp::kMax);
  if (local) std::rethrow_exception(local);
  if (failed.item<int>() != 0) {
    throw_failed_elsewhere("cpprun: " + what + " failed on another rank (its own error says why); rank " +
                           std::to_string(cpprun::rank()) + " of the job stops too.");
  }
}

std::vector<const ProcessGroup*> CheckpointTeam::groups() const {
  std::vector<const ProcessGroup*> out;
  if (replicas_) out.push_back(&*replicas_);
  for (const auto& group : tensor_parallel_) out.push_back(&group);
  return out;
}

void CheckpointTeam::share_failure(std::exception_ptr local, const std::string& what) const {
  // Each group's verdict is every member's before the next group's (Note [Teams over a {dp, tp}
  // mesh]): caught between them, so that a rank that heard it passes it on.
  for (const ProcessGroup* group : groups()) {
    try {
      detail::share_failure(*group, local, what);
    } catch (...) {
      local = std::current_exception();
    }
  }
  if (local) std::rethrow_exception(local);
}

void CheckpointTeam::share_root_failure(std::exception_ptr root_failure) const {
  if (alone()) {
    if (root_failure) std::rethrow_exception(root_failure);
    return;
  }
  std::string bytes = is_root() && root_failure ? describe_failure(root_failure) : std::string();
  broadcast_bytes(bytes);
  if (is_root() && root_failure) std::rethrow_exception(root_failure);
  if (!bytes.empty()) throw_described_failure(bytes);
}

void CheckpointTeam::broadcast_bytes(std::string& bytes) const {
  if (replicas_) cpprun::broadcast_bytes(*replicas_, bytes, 0);
  for (const auto& group : tensor_parallel_) cpprun::broadcast_bytes(group, bytes, 0);
}

void CheckpointTeam::broadcast_tensors(const std::vector<at::Tensor>& tensors) const {
  if (tensors.empty()) return;
  if (replicas_) broadcast_coalesced(*replicas_, tensors, 0);
  for (const auto& group : tensor_parallel_) broadcast_coalesced(group, tensors, 0);
}

void CheckpointTeam::broadcast_from_writer(const std::vector<at::Tensor>& tensors, int writer) const {
  if (tensors.empty()) return;
  // See Note [Teams over a {dp, tp} mesh]: writer w is (w, 0); the first step brings its values to
  // (*, 0) (the other slices' data-parallel groups move values the second step overwrites).
  if (replicas_) broadcast_coalesced(*replicas_, tensors, writer);
  for (const auto& group : tensor_parallel_) broadcast_coalesced(group, tensors, 0);
}

std::vector<std::string> CheckpointTeam::gather_from_writers(const std::string& bytes) const {
  std::vector<std::string> all = replicas_ ? cpprun::all_gather_bytes(*replicas_, bytes) : std::vector<std::string>{bytes};
  if (tensor_parallel_.empty()) return all;
  // The writers' slice gathered theirs; each tensor-parallel group takes its first rank's list.
  std::string packed = pack_strings(all);
  for (const auto& group : tensor_parallel_) cpprun::broadcast_bytes(group, packed, 0);
  return unpack_strings(packed, "the writers' bytes");
}

std::string pack_strings(const std::vector<std::string>& items) {
  std::string packed;
  for (const auto& item : items) packed += std::to_string(item.size()) + ':' + item;
  return packed;
}

std::vector<std::string> unpack_strings(const std::string& packed, const char* what) {
  std::vector<std::string> items;
  for (std::size_t at = 0; at < packed.size();) {
    const std::size_t colon = packed.find(':', at);
    TORCH_INTERNAL_ASSERT(colon != std::string::npos, what, " arrived garbled");
    const std::size_t size = std::stoull(packed.substr(at, colon - at));
    items.push_back(packed.substr(colon + 1, size));
    at = colon + 1 + size;
  }
  return items;
}

}  // namespace cpprun::detail
